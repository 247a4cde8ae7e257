/* Shared by every kiri compute shader (included after the shader's buffers and push constants).
 *
 * Every buffer is an array of 32-bit words and every tensor is found by a byte offset into its
 * binding: GGUF blocks are 18, 34 or 210 bytes long, so rows of quantized weights start at any
 * even byte, and the readers below take bytes, halves and unaligned words out of the words.
 * Buffers are allocated 16 bytes longer than asked, so the word after a tensor's last byte can
 * always be read.
 *
 * The conversions here are exact bit manipulations rather than the GPU's own conversion
 * instructions, whose rounding Vulkan leaves to the implementation: results then match the CPU
 * reference (kernels/cpu/quants.c) bit for bit on every device. */

/* KIRI_READERS(p, a) defines p_u8, p_u16, p_u32 and p_f32 reading array a at byte offsets; u16
 * needs an even offset, u32 any offset, f32 a multiple of 4. */
#define KIRI_READERS(P, A)                                                                      \
    uint P##_u8(uint o) { return (A[o >> 2] >> ((o & 3u) << 3)) & 0xffu; }                       \
    uint P##_u16(uint o) { return (A[o >> 2] >> ((o & 2u) << 3)) & 0xffffu; }                     \
    uint P##_u32(uint o)                                                                         \
    {                                                                                            \
        const uint w = o >> 2, s = (o & 3u) << 3;                                                \
        return s == 0u ? A[w] : (A[w] >> s) | (A[w + 1u] << (32u - s));                          \
    }                                                                                            \
    float P##_f32(uint o) { return uintBitsToFloat(A[o >> 2]); }

/* The workgroup's index in a dispatch spread over x and y (x is limited to 65535 groups). */
uint group_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

/* Byte k (0..3) of word w as a signed value. */
int sbyte(uint w, uint k) { return bitfieldExtract(int(w), int(k << 3), 8); }

/* IEEE binary16 bits to float: exact for every value. */
float f16_to_f32(uint h)
{
    const uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
    if (e != 0u)
        return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
    const float v = float(m) * 5.9604644775390625e-8; /* m * 2^-24, exact */
    return sign != 0u ? -v : v;
}

/* Float to binary16 bits, rounding to nearest even (kiri_f32_to_f16's definition). */
uint f32_to_f16(float f)
{
    const uint x = floatBitsToUint(f);
    const uint sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return a > 0x7f800000u ? sign | 0x7e00u | ((a >> 13) & 0x3ffu) : sign | 0x7c00u;
    if (a >= 0x477ff000u)
        return sign | 0x7c00u;
    if (a < 0x38800000u) {
        if (a < 0x33000000u)
            return sign;
        const uint e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint r = m >> shift;
        const uint rem = m & ((1u << shift) - 1u), hw = 1u << (shift - 1u);
        if (rem > hw || (rem == hw && (r & 1u) != 0u))
            r++;
        return sign | r;
    }
    uint r = (a - 0x38000000u) >> 13;
    const uint rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) != 0u))
        r++;
    return sign | r;
}

/* The float nearest to f that binary16 can hold. */
float f16_round(float f) { return f16_to_f32(f32_to_f16(f)); }

float bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }

/* The float nearest to f that bfloat16 can hold (kiri_f32_to_bf16: ties to even, NaN quieted). */
float bf16_round(float f)
{
    const uint x = floatBitsToUint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return uintBitsToFloat(((x >> 16) | 0x40u) << 16);
    return uintBitsToFloat(((x + 0x7fffu + ((x >> 16) & 1u)) >> 16) << 16);
}

/* C's roundf: halfway cases away from zero (GLSL's round() may go either way). */
float round_away(float x)
{
    const float t = trunc(x);
    return abs(x - t) >= 0.5 ? t + sign(x) : t;
}

/* a / b rounded to nearest even, as IEEE division (and so the CPU) gives it. Vulkan lets GPU
 * division be 2.5 ulp off, and an activation scale off by one ulp moves a value that sits on a
 * rounding boundary to the other quant. Long division of the 24-bit significands gives 24 bits,
 * a guard bit and a sticky remainder. Zeros, subnormals, infinities and NaNs in or out fall back
 * to the GPU's division. */
float div_rn(float a, float b)
{
    const uint ua = floatBitsToUint(a), ub = floatBitsToUint(b);
    const int ea = int((ua >> 23) & 0xffu), eb = int((ub >> 23) & 0xffu);
    if (ea == 0 || eb == 0 || ea == 255 || eb == 255)
        return a / b;
    uint ma = (ua & 0x7fffffu) | 0x800000u;
    const uint mb = (ub & 0x7fffffu) | 0x800000u;
    int e = ea - eb + 127;
    if (ma < mb) {
        ma <<= 1;
        e -= 1;
    }
    uint q = 0u, r = ma;
    for (int i = 0; i < 25; i++) {
        q <<= 1;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1;
    }
    uint m = q >> 1;
    if ((q & 1u) != 0u && (r != 0u || (m & 1u) != 0u))
        m++;
    if (m == 0x1000000u) {
        m >>= 1;
        e += 1;
    }
    if (e <= 0 || e >= 255)
        return a / b;
    return uintBitsToFloat(((ua ^ ub) & 0x80000000u) | (uint(e) << 23) | (m & 0x7fffffu));
}

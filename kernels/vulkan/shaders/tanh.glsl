/* tanh to within a few ulp on every device, for the SOFTCAP shader (included after
 * common.glsl). GLSL's tanh inherits exp's error bound, which Vulkan makes grow with the argument,
 * and a formula through exp loses the small arguments to cancellation; so, as Cephes' tanhf does:
 * an odd minimax polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above, and +-1 past 20 (tanh is
 * within 1e-17 of 1 there; e^40 is still a normal float). */
float tanh_acc(float x)
{
    const float a = abs(x);
    if (a >= 20.0)
        return x > 0.0 ? 1.0 : -1.0;
    if (a >= 0.625) {
        precise float t = 1.0 - div_rn(2.0, exp(2.0 * a) + 1.0);
        return x > 0.0 ? t : -t;
    }
    const float z = x * x;
    precise float t = x + x * z * ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z +
                                    1.33314422036e-1) * z - 3.33332819422e-1);
    return t;
}

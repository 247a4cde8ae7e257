#!/usr/bin/env python3
"""Writes the malformed-GGUF corpus, cases G01-G40 (bad headers, metadata, tensor infos, data
sections and model contents), into a directory.

    python3 tests/bad_gguf.py OUT_DIR [--model stories260K.gguf]
    python3 tests/bad_gguf.py --seeds OUT_DIR      # small fuzz seeds (tests/fuzz/seeds/gguf)

One file per case, named after its row (``G03-version-0.gguf``), and ``expected.tsv`` with one
line per file: file name, expectation, and a substring the error message must contain (may be
empty). Expectations:

    reject  kiri must refuse the file: exit status 1, one error line naming the problem;
    accept  kiri must load it: exit status 0;
    any     either of the two (the loader may reject the file, or unset the value and warn),
            but never a crash, a signal or a hang.

Parser-level rows (G01-G24) are small images, or stories260K with one field patched in place,
so the only fault is the one named. Model-level rows (G25-G37) rewrite stories260K (llama, F32,
512-token SentencePiece vocabulary) through the small reader and writer below. Standard library
only.
"""
import math
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.environ.get(
    "KIRI_STORIES_GGUF",
    os.path.join(os.environ.get("KIRI_SHARED_DIR", os.path.join(HERE, "..", "..", "shared")),
                 "models", "stories260K.gguf"))

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}

# ggml tensor types: (elements per block, bytes per block)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
        9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
        14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
        28: (1, 8), 30: (1, 2)}
T_F32, T_Q4_0, T_I32, T_F64 = 0, 2, 26, 28


def tensor_nbytes(ttype, ne):
    bs, ts = GGML[ttype]
    n = 1
    for d in ne:
        n *= d
    return n // bs * ts


def pad_to(x, a):
    return (x + a - 1) // a * a


# ------------------------------------------------------------------------------------------------
# Reader and writer
# ------------------------------------------------------------------------------------------------

class KV:
    def __init__(self, key, vtype, value, elem_type=None):
        self.key, self.type, self.value, self.elem_type = key, vtype, value, elem_type
        self.off = {}   # field name -> file offset (set by the reader)


class Tensor:
    def __init__(self, name, ne, ttype, data):
        self.name, self.ne, self.type, self.data = name, list(ne), ttype, data
        self.off = {}


class Model:
    """A parsed GGUF file: version, pairs in order, tensors in order (data as bytes)."""

    def __init__(self):
        self.version, self.kvs, self.tensors, self.alignment = 3, [], [], 32

    def kv(self, key):
        for kv in self.kvs:
            if kv.key == key:
                return kv
        raise KeyError(key)

    def set(self, key, vtype, value, elem_type=None):
        for kv in self.kvs:
            if kv.key == key:
                kv.type, kv.value, kv.elem_type = vtype, value, elem_type
                return
        self.kvs.append(KV(key, vtype, value, elem_type))

    def drop(self, key):
        self.kvs = [kv for kv in self.kvs if kv.key != key]

    def tensor(self, name):
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def read_gguf(data):
    m = Model()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def take_str():
        nonlocal pos
        n = take("<Q")
        s = bytes(data[pos:pos + n])
        pos += n
        return s

    def value(t):
        if t == STR:
            return take_str()
        return take(SCALAR[t])

    assert data[:4] == b"GGUF"
    pos = 4
    m.version = take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    for _ in range(n_kv):
        start = pos
        key = take_str().decode()
        tpos = pos
        t = take("<I")
        kv = KV(key, t, None)
        kv.off = {"pair": start, "type": tpos, "value": pos}
        if t == ARR:
            kv.elem_type = take("<I")
            kv.off["count"] = pos
            n = take("<Q")
            kv.value = [value(kv.elem_type) for _ in range(n)]
        else:
            kv.value = value(t)
        m.kvs.append(kv)
        if key == "general.alignment":
            m.alignment = kv.value
    infos = []
    for _ in range(n_tensors):
        off = {"name": pos}
        name = take_str().decode()
        off["n_dims"] = pos
        nd = take("<I")
        off["ne"] = pos
        ne = [take("<Q") for _ in range(nd)]
        off["type"] = pos
        t = take("<I")
        off["offset"] = pos
        o = take("<Q")
        infos.append((name, ne, t, o, off))
    m.infos_end = pos
    data_start = pad_to(pos, m.alignment)
    for name, ne, t, o, off in infos:
        start = data_start + o
        tensor = Tensor(name, ne, t, bytes(data[start:start + tensor_nbytes(t, ne)]))
        tensor.off = off
        m.tensors.append(tensor)
    return m


def enc_str(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("<Q", len(s)) + s


def enc_value(t, v, elem_type=None):
    if t == STR:
        return enc_str(v)
    if t == ARR:
        out = [struct.pack("<IQ", elem_type, len(v))]
        if elem_type == STR:
            out += [enc_str(x) for x in v]
        else:
            out.append(struct.pack("<%d%s" % (len(v), SCALAR[elem_type][1]), *v))
        return b"".join(out)
    return struct.pack(SCALAR[t], v)


def write_gguf(m, alignment=None, pad_tail=True):
    """Serialises a Model the way llama.cpp lays files out: pairs, tensor infos with running
    offsets (each tensor padded to the alignment), padding, data. Without pad_tail a file with
    no tensors ends right after its tensor table (as some vocab-only files do)."""
    a = alignment or m.alignment
    out = [b"GGUF", struct.pack("<IQQ", m.version, len(m.tensors), len(m.kvs))]
    for kv in m.kvs:
        out += [enc_str(kv.key), struct.pack("<I", kv.type), enc_value(kv.type, kv.value, kv.elem_type)]
    off = 0
    for t in m.tensors:
        out += [enc_str(t.name), struct.pack("<I", len(t.ne))]
        out += [struct.pack("<Q", d) for d in t.ne]
        out.append(struct.pack("<IQ", t.type, off))
        off = pad_to(off + len(t.data), a)
    head = b"".join(out)
    if not pad_tail and not m.tensors:
        return head
    body = [head, b"\0" * (pad_to(len(head), a) - len(head))]
    for t in m.tensors:
        body += [t.data, b"\0" * (pad_to(len(t.data), a) - len(t.data))]
    return b"".join(body)


def patch(data, at, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


# ------------------------------------------------------------------------------------------------
# Small synthetic images (the same shapes as tests/test_gguf.c uses)
# ------------------------------------------------------------------------------------------------

def tiny_model():
    m = Model()
    m.kvs.append(KV("general.architecture", STR, b"llama"))
    m.tensors.append(Tensor("a", [4], T_F32, struct.pack("<4f", 0, 1, 2, 3)))
    m.tensors.append(Tensor("b", [8, 2], T_F32, struct.pack("<16f", *range(100, 116))))
    return m


def vocab_model():
    m = Model()
    m.version = 2
    m.kvs += [KV("general.architecture", STR, b"llama"),
              KV("llama.context_length", U32, 128),
              KV("tokenizer.ggml.tokens", ARR, [b"<unk>", b"<s>", b"", "\u2581the".encode()], STR),
              KV("tokenizer.ggml.scores", ARR, [0.0, -1.0, -2.0, -3.0], F32),
              KV("tokenizer.ggml.add_bos_token", BOOL, 1),
              KV("flags", ARR, [0, 1, 0], BOOL),
              KV("x.f64", F64, 0.5)]
    return m


def quant_model():
    m = Model()
    m.alignment = 64
    m.kvs += [KV("general.alignment", U32, 64), KV("general.architecture", STR, b"qwen2"),
              KV("i8.neg", I8, -2)]
    m.tensors += [Tensor("q4", [64, 2], T_Q4_0, bytes(range(72))),
                  Tensor("q8", [32], 8, bytes((i * 3) & 255 for i in range(34))),
                  Tensor("k4", [256, 1, 1, 2], 12, bytes((i * 7) & 255 for i in range(288)))]
    return m


def raw_header(version=3, n_tensors=0, n_kv=0, magic=b"GGUF"):
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


# ------------------------------------------------------------------------------------------------
# The cases
# ------------------------------------------------------------------------------------------------

def cases(model_path=DEFAULT_MODEL):
    """Yields (file name, expectation, substring, bytes) for every case."""
    with open(model_path, "rb") as f:
        orig = f.read()
    base = read_gguf(orig)

    def fresh():
        return read_gguf(orig)

    def first(pred):
        return next(kv for kv in base.kvs if pred(kv))

    tokens = base.kv("tokenizer.ggml.tokens")
    model_kv = base.kv("tokenizer.ggml.model")
    scores = base.kv("tokenizer.ggml.scores")
    emb = base.tensor("token_embd.weight")
    onorm = base.tensor("output_norm.weight")
    down = base.tensor("blk.0.ffn_down.weight")

    def rej(name, sub, data):
        return (name + ".gguf", "reject", sub, data)

    def acc(name, data):
        return (name + ".gguf", "accept", "", data)

    def any_(name, data):
        return (name + ".gguf", "any", "", data)

    yield acc("G00-valid-stories260K", write_gguf(fresh()))

    # G01-G03: header
    yield rej("G01-empty", "truncated header", b"")
    yield rej("G01-truncated-10", "truncated header", orig[:10])
    yield rej("G01-truncated-23", "truncated header", orig[:23])
    yield rej("G02-magic-GGUG", "not GGUF", b"GGUG" + orig[4:64])
    yield rej("G02-magic-FUGG-byteswapped", "not GGUF", b"FUGG" + orig[4:64])
    yield rej("G02-magic-GGML-legacy", "not GGUF", b"lmgg" + orig[4:64])
    yield rej("G02-magic-GGJT-legacy", "not GGUF", b"tjgg" + orig[4:64])
    for v, label in ((0, "0"), (1, "1"), (4, "4"), (0x03000000, "byteswapped")):
        yield rej("G03-version-" + label, "unsupported version", patch(orig[:4096], 4, "<I", v))

    # G04-G05: counts
    yield rej("G04-n_tensors-int64max", "n_tensors", patch(orig[:4096], 8, "<Q", 2**63 - 1))
    yield rej("G04-n_tensors-negative", "n_tensors", patch(orig[:4096], 8, "<q", -1))
    yield rej("G04-n_tensors-over-file", "n_tensors", patch(orig, 8, "<Q", len(orig) // 33 + 1))
    yield rej("G05-n_kv-int64max", "n_kv", patch(orig[:4096], 16, "<Q", 2**63 - 1))
    yield rej("G05-n_kv-over-remaining", "n_kv", patch(orig[:4096], 16, "<Q", 1000))

    # G06-G13: pairs (the first pair is tokenizer.ggml.tokens at offset 24)
    yield rej("G06-key-length-0", "key", patch(orig, 24, "<Q", 0))
    yield rej("G06-key-length-max", "key", patch(orig, 24, "<Q", 2**64 - 1))
    yield rej("G06-key-past-end", "key", patch(orig[:24 + 8 + 100], 24, "<Q", 200))
    yield rej("G06-key-over-256", "key", patch(orig, 24, "<Q", 300))
    key0 = 24 + 8
    yield rej("G07-key-invalid-utf8", "UTF-8", orig[:key0 + 3] + b"\xc0\x80" + orig[key0 + 5:])
    yield rej("G07-key-embedded-nul", "NUL", orig[:key0 + 3] + b"\0" + orig[key0 + 4:])
    n0 = emb.off["name"] + 8
    yield rej("G07-tensor-name-invalid-utf8", "UTF-8", orig[:n0] + b"\xff" + orig[n0 + 1:])
    m = fresh()
    m.kvs.append(KV("general.name", STR, b"again"))
    yield rej("G08-duplicate-key", "duplicate key", write_gguf(m))
    yield rej("G09-kv-type-13", "unknown type", patch(orig, model_kv.off["type"], "<I", 13))
    yield rej("G09-kv-type-ffffffff", "unknown type",
              patch(orig, model_kv.off["type"], "<I", 0xFFFFFFFF))
    yield rej("G10-nested-array", "nested", patch(orig, tokens.off["value"], "<I", ARR))
    yield rej("G10-array-elem-type-unknown", "unknown array element type",
              patch(orig, tokens.off["value"], "<I", 13))
    yield rej("G11-array-count-2p62", "array count", patch(orig, tokens.off["count"], "<Q", 2**62))
    yield rej("G11-array-count-times-size-wraps", "array count",
              patch(orig, scores.off["count"], "<Q", 2**62))
    yield rej("G12-string-past-end", "string length",
              patch(orig, model_kv.off["value"], "<Q", 2_000_000))
    yield rej("G12-string-over-16MiB", "string length",
              patch(orig, model_kv.off["value"], "<Q", (16 << 20) + 1))
    m = fresh()
    m.kvs.append(KV("tokenizer.ggml.add_bos_token", BOOL, 2))
    yield rej("G13-bool-byte-2", "not 0 or 1", write_gguf(m))

    # G14: general.alignment (the writer keeps the default layout: rejected before it matters)
    for label, vtype, value, et in (("0", U32, 0, None), ("3", U32, 3, None),
                                    ("2p31", U32, 2**31, None), ("i32", I32, 32, None),
                                    ("string", STR, b"32", None), ("array", ARR, [32], U32)):
        m = fresh()
        m.kvs.append(KV("general.alignment", vtype, value, et))
        yield rej("G14-alignment-" + label, "general.alignment", write_gguf(m, alignment=32))

    # G15-G24: tensor table and data
    m = fresh()
    m.tensors[1].name = "n" * 64
    yield rej("G15-tensor-name-64-bytes", "name", write_gguf(m))
    m = fresh()
    m.tensors[1].name = ""
    yield rej("G15-tensor-name-empty", "name", write_gguf(m))
    m = fresh()
    m.tensor("blk.0.attn_k.weight").name = "blk.0.attn_q.weight"
    yield rej("G16-duplicate-tensor-name", "duplicate tensor name", write_gguf(m))
    for nd in (0, 5, 0xFFFFFFFF):
        yield rej("G17-n_dims-%x" % nd, "dimensions", patch(orig, emb.off["n_dims"], "<I", nd))
    yield rej("G18-ne-negative", "not positive", patch(orig, emb.off["ne"] + 8, "<q", -512))
    yield rej("G18-ne-zero", "not positive", patch(orig, emb.off["ne"], "<Q", 0))
    d = patch(orig, emb.off["ne"], "<Q", 2**32)
    yield rej("G19-ne-product-overflows", "overflows", patch(d, emb.off["ne"] + 8, "<Q", 2**32))
    d = patch(orig, emb.off["ne"], "<Q", 2**61)
    d = patch(d, emb.off["ne"] + 8, "<Q", 2)
    yield rej("G19-bytes-overflow-i32", "overflows", patch(d, emb.off["type"], "<I", T_I32))
    d = patch(orig, emb.off["ne"], "<Q", 2**61)
    d = patch(d, emb.off["ne"] + 8, "<Q", 8)
    yield rej("G19-elements-overflow-q8_0", "overflows", patch(d, emb.off["type"], "<I", 8))
    d = patch(orig, emb.off["ne"], "<Q", 2**62 - 1)
    yield rej("G19-ne0-2p62-1-f32-pad-wraps", "overflows", patch(d, emb.off["ne"] + 8, "<Q", 1))
    for t in (4, 5, 40, 0xFFFFFFFF):
        yield rej("G20-type-%d" % t if t < 100 else "G20-type-ffffffff", "unsupported type",
                  patch(orig, emb.off["type"], "<I", t))
    yield rej("G21-q4_0-ne0-172", "block size", patch(orig, down.off["type"], "<I", T_Q4_0))
    yield rej("G22-offset-out-of-order", "offset",
              patch(orig, onorm.off["offset"], "<Q", 131072 + 32))
    yield rej("G22-offset-unaligned", "alignment", patch(orig, onorm.off["offset"], "<Q", 131073))
    yield rej("G23-offset-wraps", "offset", patch(orig, onorm.off["offset"], "<Q", 2**64 - 32))
    yield rej("G23-data-past-end", "past the end", orig[:-100])
    yield rej("G24-truncated-in-padding", "truncated inside the padding", orig[:base.infos_end + 4])

    # G25-G37: model level (stories260K rewritten)
    def variant(name, expect, sub, edit):
        mm = fresh()
        edit(mm)
        return (name + ".gguf", expect, sub, write_gguf(mm))

    for key in ("general.architecture", "llama.block_count", "llama.embedding_length",
                "llama.context_length", "tokenizer.ggml.model"):
        yield variant("G25-missing-" + key, "reject", "missing key",
                      lambda mm, k=key: mm.drop(k))
    yield variant("G26-block_count-string", "reject", "llama.block_count",
                  lambda mm: mm.set("llama.block_count", STR, b"5"))
    yield variant("G26-block_count-f32", "reject", "llama.block_count",
                  lambda mm: mm.set("llama.block_count", F32, 5.0))
    yield variant("G26-block_count-array", "reject", "llama.block_count",
                  lambda mm: mm.set("llama.block_count", ARR, [5], U32))
    yield variant("G27-unknown-architecture", "reject", "unsupported architecture",
                  lambda mm: mm.set("general.architecture", STR, b"llama9000"))
    for label, key, vtype, value in (
            ("block_count-0", "llama.block_count", U32, 0),
            ("block_count-huge", "llama.block_count", U32, 100000),
            ("head_count-0", "llama.attention.head_count", U32, 0),
            ("head_count_kv-not-divisor", "llama.attention.head_count_kv", U32, 3),
            ("embd-not-multiple-of-heads", "llama.attention.head_count", U32, 7),
            ("context_length-0", "llama.context_length", U32, 0),
            ("context_length-2p25", "llama.context_length", U32, 2**25),
            ("rms_eps-0", "llama.attention.layer_norm_rms_epsilon", F32, 0.0),
            ("rms_eps-negative", "llama.attention.layer_norm_rms_epsilon", F32, -1e-5),
            ("rms_eps-nan", "llama.attention.layer_norm_rms_epsilon", F32, math.nan),
            ("rms_eps-inf", "llama.attention.layer_norm_rms_epsilon", F32, math.inf),
            ("rope_freq_base-0", "llama.rope.freq_base", F32, 0.0),
            ("rope_freq_base-nan", "llama.rope.freq_base", F32, math.nan)):
        yield variant("G28-" + label, "reject", "",
                      lambda mm, k=key, t=vtype, v=value: mm.set(k, t, v))

    def experts(mm):
        mm.set("llama.expert_count", U32, 2)
        mm.set("llama.expert_used_count", U32, 4)
    yield variant("G28-expert_used-over-expert_count", "reject", "", experts)

    def drop_tensor(name):
        return lambda mm: setattr(mm, "tensors", [t for t in mm.tensors if t.name != name])
    yield variant("G29-missing-token_embd", "reject", "token_embd.weight",
                  drop_tensor("token_embd.weight"))
    yield variant("G29-missing-blk0-attn_q", "reject", "blk.0.attn_q.weight",
                  drop_tensor("blk.0.attn_q.weight"))
    # A tensor the architecture's graph does not use is a variant kiri does not know: refused by name.
    yield variant("G29-extra-tensor", "reject", "blk.0.extra.weight",
                  lambda mm: mm.tensors.append(Tensor("blk.0.extra.weight", [64], T_F32, bytes(256))))

    def reshape(name, ne, ttype=None):
        def edit(mm):
            t = mm.tensor(name)
            t.ne = list(ne)
            if ttype is not None:
                t.type = ttype
            n = tensor_nbytes(t.type, t.ne)
            t.data = (t.data + bytes(max(0, n - len(t.data))))[:n]
        return edit
    yield variant("G30-token_embd-vocab-plus-1", "reject", "wrong shape",
                  reshape("token_embd.weight", [64, 513]))
    yield variant("G30-attn_k-transposed", "reject", "wrong shape",
                  reshape("blk.0.attn_k.weight", [32, 64]))
    yield variant("G31-matmul-weight-i32", "reject", "",
                  reshape("blk.0.attn_q.weight", [64, 64], T_I32))
    yield variant("G31-matmul-weight-f64", "reject", "",
                  reshape("blk.0.attn_q.weight", [64, 64], T_F64))

    def vocab_511(mm):
        for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            mm.kv(k).value = mm.kv(k).value[:511]
    yield variant("G32-tokens-511-vs-embd-512", "reject", "", vocab_511)
    yield variant("G32-output-rows-511", "reject", "", reshape("output.weight", [64, 511]))

    def short_scores(mm):
        mm.kv("tokenizer.ggml.scores").value = mm.kv("tokenizer.ggml.scores").value[:500]
    yield variant("G33-scores-count-500", "reject", "", short_scores)
    yield variant("G33-scores-u8", "reject", "",
                  lambda mm: mm.set("tokenizer.ggml.scores", ARR, [0] * 512, U8))
    yield variant("G33-token_type-u8", "reject", "",
                  lambda mm: mm.set("tokenizer.ggml.token_type", ARR, [1] * 512, U8))
    yield variant("G34-bos-id-512", "any", "",
                  lambda mm: mm.set("tokenizer.ggml.bos_token_id", U32, 512))
    yield variant("G34-eos-id-minus-2", "any", "",
                  lambda mm: mm.set("tokenizer.ggml.eos_token_id", I32, -2))

    def token_type(i, v):
        def edit(mm):
            mm.kv("tokenizer.ggml.token_type").value[i] = v
        return edit
    yield variant("G34-token_type-99", "any", "", token_type(300, 99))

    def token_text(i, text):
        def edit(mm):
            mm.kv("tokenizer.ggml.tokens").value[i] = text
        return edit
    # ids 3..258 are the byte tokens <0x00>..<0xFF> (token_type 6)
    yield variant("G35-byte-token-0x-1", "reject", "", token_text(3, b"<0x-1>"))
    yield variant("G35-byte-token-0xZZ", "reject", "", token_text(3, b"<0xZZ>"))
    yield variant("G35-byte-token-0x100", "reject", "", token_text(3, b"<0x100>"))
    # GGUF bounds a token's text only by the string length; real vocabularies hold 512-byte and
    # longer tokens and llama.cpp loads them, so a long token loads (issue 12 supersedes the
    # 256-byte bound BAD-INPUTS.md G35 names).
    yield variant("G35-token-text-300-bytes", "accept", "", token_text(400, b"a" * 300))
    yield variant("G35-token-empty", "reject", "", token_text(400, b""))

    def merges(items):
        def edit(mm):
            mm.set("tokenizer.ggml.model", STR, b"gpt2")
            mm.set("tokenizer.ggml.pre", STR, b"gpt-2")
            mm.set("tokenizer.ggml.merges", ARR, items, STR)
        return edit
    yield variant("G35-merge-without-space", "reject", "", merges([b"ab"]))
    yield variant("G35-merge-unknown-tokens", "reject", "", merges([b"\xe2\x96\x81zzq qqz"]))
    big = b"{{ messages }}" + b" " * (10 * 1000 * 1000)
    yield variant("G36-chat-template-10MB", "any", "",
                  lambda mm: mm.set("tokenizer.chat_template", STR, big))
    yield variant("G36-chat-template-unbounded-loop", "any", "",
                  lambda mm: mm.set("tokenizer.chat_template", STR,
                                    b"{% for i in range(999999999999) %}x{% endfor %}"))
    yield variant("G36-chat-template-dunder", "any", "",
                  lambda mm: mm.set("tokenizer.chat_template", STR,
                                    b"{{ messages.__class__.__mro__ }}"))

    def split(count, no=0):
        def edit(mm):
            mm.set("split.no", U16, no)
            mm.set("split.count", U16, count)
            mm.set("split.tensors.count", I32, len(mm.tensors))
        return edit
    yield variant("G37-split-count-2-missing-shard", "reject", "split", split(2))
    yield variant("G37-split-no-beyond-count", "reject", "split", split(1, 3))

    # G38: a file still being written is never mapped, whatever its content.
    yield ("G38-still-downloading.gguf.partial", "reject", "partial", orig)

    # G39: deterministic mutations of the header region (a few edits each), never a crash.
    rng = random.Random(39)
    interesting = [0, 1, 2, 63, 64, 255, 256, 2**24, 2**31, 2**32, 2**62, 2**63 - 1, 2**64 - 1]
    for i in range(40):
        b = bytearray(orig)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(0, base.infos_end)
            kind = rng.randrange(3)
            if kind == 0:
                b[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                b[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
            else:
                v = rng.choice(interesting)
                b[at:at + 8] = struct.pack("<Q", v)[:len(b[at:at + 8])]
        yield any_("G39-mutant-%03d" % i, bytes(b))

    # G40: accepted as documented.
    yield acc("G40-trailing-garbage", orig + bytes((i * 37) & 255 for i in range(4096)))
    m = fresh()
    m.tensors = []
    yield acc("G40-vocab-only-no-tensors", write_gguf(m))
    yield acc("G40-vocab-only-unpadded", write_gguf(m, pad_tail=False))


def seeds(model_path=DEFAULT_MODEL):
    """Small fuzz seeds (each < 64 KiB): the three synthetic images, stories260K's metadata with
    its tensor table and data cut down to two small tensors, and a few of the small bad cases."""
    yield "tiny.gguf", write_gguf(tiny_model())
    yield "vocab-v2.gguf", write_gguf(vocab_model())
    yield "quant-align64.gguf", write_gguf(quant_model())
    with open(model_path, "rb") as f:
        orig = f.read()
    m = read_gguf(orig)
    keep = [m.tensor("output_norm.weight"), m.tensor("blk.0.attn_norm.weight")]
    m.tensors = keep
    yield "stories-2-tensors.gguf", write_gguf(m)
    m.tensors = []
    yield "stories-vocab-only.gguf", write_gguf(m, pad_tail=False)
    yield "stories-truncated-8k.gguf", orig[:8192]
    for name, expect, sub, data in cases(model_path):
        if name.startswith(("G03-version-1", "G14-alignment-3", "G22-offset-unaligned")):
            continue
        if len(data) <= 4096 and not name.startswith("G39"):
            yield "bad-" + name, data


def main(argv):
    model = DEFAULT_MODEL
    args = list(argv[1:])
    if "--model" in args:
        i = args.index("--model")
        model = args[i + 1]
        del args[i:i + 2]
    if len(args) == 2 and args[0] == "--seeds":
        out = args[1]
        os.makedirs(out, exist_ok=True)
        for name, data in seeds(model):
            assert len(data) < 64 * 1024, name
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
        return 0
    if len(args) != 1:
        sys.stderr.write(__doc__)
        return 2
    out = args[0]
    os.makedirs(out, exist_ok=True)
    lines = []
    for name, expect, sub, data in cases(model):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        lines.append("%s\t%s\t%s\n" % (name, expect, sub))
    with open(os.path.join(out, "expected.tsv"), "w") as f:
        f.write("# file\texpectation (reject|accept|any)\tmessage substring\n")
        f.writelines(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#include "tokenizer_pre.h"

#include <string.h>

/* The split patterns of the Hugging Face tokenizer definitions these names stand for, in the
 * forms llama.cpp runs them (case-insensitive groups spelled out, the lookahead spellings of
 * upper/lower-case letter runs), so that the two split text alike. Patterns apply in sequence:
 * each splits the pieces the previous one left (matches and the stretches between them). */
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}" RE_TAIL
#define RE_QWEN2 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" RE_TAIL
#define RE_QWEN35                                                                               \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"                             \
    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_JAIS2                                                                                \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"  \
    "|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)"            \
    "|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"
/* Letter runs as [upper]*[lower]+ or [upper]+[lower]*, where a letter outside ASCII counts as
 * both (llama.cpp's spelling of Tekken's and GPT-4o's \p{Lu}/\p{Ll} classes). */
#define RE_CASED_WORDS(suffix)                                                                  \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" suffix               \
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" suffix
#define RE_TEKKEN                                                                               \
    RE_CASED_WORDS("") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                \
    RE_CASED_WORDS(RE_CONTRACTIONS "?")                                                         \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GRANITE_EMB                                                                          \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+"          \
    RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+"                     \
    "((?=[\\p{L}\\p{M}])([^A-Z]))*" RE_CONTRACTIONS "?"                                         \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_YOUTU                                                                                \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"  \
    RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"              \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" RE_CONTRACTIONS "?"                                        \
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_YOUTU_CJK                                                                            \
    "[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+"                                                 \
    "|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}\\x{2018}\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}"       \
    "\\x{FF0C}\\x{3001}-\\x{303F}\\x{FE30}-\\x{FE4F}]+|[\\x{3105}-\\x{312F}]+"                  \
    "|[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_CJK_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
#define RE_CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_DEEPSEEK3_WORDS(nl)                                                                  \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"        \
    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+" nl "|\\s+(?!\\S)|\\s+"
/* DeepSeek LLM's Latin, Greek, Cyrillic, ... letters (its tokenizer lists them by range). */
#define RE_DEEPSEEK_LETTERS                                                                     \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"          \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"      \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"               \
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}" \
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"              \
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"              \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"      \
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"     \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"              \
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"      \
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"      \
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"                \
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"               \
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"              \
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"              \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"          \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"      \
    "\\x{1E900}-\\x{1E943}]+"
#define RE_PORO " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
#define RE_NEWLINES "[^\\n]+|[\\n]+"

static const struct kiri_pre_kind
    PK_DEFAULT = {{"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, 0},
    PK_GPT2 = {{RE_GPT2}, 0},
    PK_LLAMA3 = {{RE_LLAMA3}, KIRI_PRE_IGNORE_MERGES | KIRI_PRE_ADD_BOS},
    PK_LLAMA3_MERGED = {{RE_LLAMA3}, 0},
    PK_JAIS2 = {{RE_JAIS2}, 0},
    PK_QWEN2 = {{RE_QWEN2}, 0},
    PK_QWEN35 = {{RE_QWEN35}, 0},
    PK_DIGITS_GPT2 = {{"\\p{N}", RE_GPT2}, 0},
    PK_FALCON = {{"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, 0},
    PK_DEEPSEEK_LLM = {{"[\r\n]", RE_DEEPSEEK_LETTERS,
                        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
                        "\\x{3000}-\\x{3002}]+",
                        "\\s+$", RE_CJK_HANGUL, "\\p{N}+"},
                       0},
    PK_DEEPSEEK_CODER = {{"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, "\\p{N}"}, 0},
    PK_DEEPSEEK3 = {{"\\p{N}{1,3}", RE_CJK_KANA, RE_DEEPSEEK3_WORDS("[\r\n]*|\\s*[\r\n]+")}, 0},
    PK_SPARK = {{"\\p{N}{1,3}", RE_CJK_KANA, RE_DEEPSEEK3_WORDS("|[\r\n]"), "\\p{N}"}, 0},
    PK_YOUTU = {{RE_YOUTU_CJK, RE_YOUTU}, KIRI_PRE_IGNORE_MERGES},
    PK_PORO = {{RE_PORO}, 0},
    PK_VIKING = {{RE_PORO, "\\p{N}"}, 0},
    PK_TEKKEN = {{RE_TEKKEN}, KIRI_PRE_IGNORE_MERGES | KIRI_PRE_ADD_BOS},
    PK_CHAMELEON = {{"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                     "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2},
                    KIRI_PRE_ADD_BOS},
    PK_GPT4O = {{RE_GPT4O}, 0},
    PK_GRANITE_EMB = {{RE_GRANITE_EMB}, KIRI_PRE_IGNORE_MERGES},
    PK_BAILING = {{"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                   "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
                  0},
    PK_SEED_CODER = {{RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}"
                      "| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                     0},
    PK_UFAKZEKA = {{"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" RE_TAIL}, 0},
    PK_LAGUNA = {{RE_NEWLINES, RE_QWEN2}, 0},
    PK_EXAONE_MOE = {{RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+"
                      "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"},
                     0},
    PK_MINICPM5 = {{"\\p{N}{1,3}", RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+" RE_TAIL},
                   KIRI_PRE_IGNORE_MERGES},
    PK_GEMMA4 = {{RE_NEWLINES}, KIRI_PRE_FORCE_BOS | KIRI_PRE_RAW};

/* tokenizer.ggml.pre names and what they stand for (the names llama.cpp's loader knows, less
 * those that need more than a split: BERT-style separators, hand-written splitters). */
static const struct {
    const char *name;
    const struct kiri_pre_kind *kind;
} pre_table[] = {
    {"default", &PK_DEFAULT},
    {"gpt-2", &PK_GPT2}, {"phi-2", &PK_GPT2}, {"mpt", &PK_GPT2}, {"olmo", &PK_GPT2},
    {"jais", &PK_GPT2}, {"trillion", &PK_GPT2}, {"granite-docling", &PK_GPT2},
    {"jina-es", &PK_GPT2}, {"jina-de", &PK_GPT2}, {"jina-v2-es", &PK_GPT2},
    {"jina-v2-de", &PK_GPT2}, {"gigachat", &PK_GPT2}, {"a.x-4.0", &PK_GPT2},
    {"mellum", &PK_GPT2}, {"modern-bert", &PK_GPT2}, {"exaone4", &PK_GPT2},
    {"llama3", &PK_LLAMA3}, {"llama-v3", &PK_LLAMA3}, {"llama-bpe", &PK_LLAMA3},
    {"falcon3", &PK_LLAMA3}, {"falcon-h1", &PK_LLAMA3}, {"pixtral", &PK_LLAMA3},
    {"midm-2.0", &PK_LLAMA3}, {"lfm2", &PK_LLAMA3}, {"jina-v5-nano", &PK_LLAMA3},
    {"dbrx", &PK_LLAMA3_MERGED}, {"smaug-bpe", &PK_LLAMA3_MERGED},
    {"jais-2", &PK_JAIS2},
    {"qwen2", &PK_QWEN2}, {"deepseek-r1-qwen", &PK_QWEN2}, {"kormo", &PK_QWEN2},
    {"f2llmv2", &PK_QWEN2}, {"megrez", &PK_QWEN2}, {"stablelm2", &PK_QWEN2},
    {"hunyuan", &PK_QWEN2}, {"solar-open", &PK_QWEN2}, {"grok-2", &PK_QWEN2},
    {"qwen35", &PK_QWEN35},
    {"starcoder", &PK_DIGITS_GPT2}, {"refact", &PK_DIGITS_GPT2}, {"command-r", &PK_DIGITS_GPT2},
    {"smollm", &PK_DIGITS_GPT2}, {"codeshell", &PK_DIGITS_GPT2}, {"exaone", &PK_DIGITS_GPT2},
    {"minerva-7b", &PK_DIGITS_GPT2}, {"mellum2", &PK_DIGITS_GPT2},
    {"falcon", &PK_FALCON},
    {"deepseek-llm", &PK_DEEPSEEK_LLM},
    {"deepseek-coder", &PK_DEEPSEEK_CODER},
    {"deepseek-v3", &PK_DEEPSEEK3}, {"hunyuan-dense", &PK_DEEPSEEK3}, {"hy_v4", &PK_DEEPSEEK3},
    {"joyai-llm", &PK_DEEPSEEK3},
    {"spark2_5", &PK_SPARK},
    {"youtu", &PK_YOUTU},
    {"poro-chat", &PK_PORO}, {"bloom", &PK_PORO}, {"gpt3-finnish", &PK_PORO},
    {"viking", &PK_VIKING},
    {"tekken", &PK_TEKKEN},
    {"chameleon", &PK_CHAMELEON},
    {"gpt-4o", &PK_GPT4O}, {"llama4", &PK_GPT4O}, {"kanana2", &PK_GPT4O}, {"talkie", &PK_GPT4O},
    {"minimax-m2", &PK_GPT4O},
    {"granite-embed-multi-97m", &PK_GRANITE_EMB},
    {"bailingmoe", &PK_BAILING}, {"bailingmoe2", &PK_BAILING}, {"llada-moe", &PK_BAILING},
    {"seed-coder", &PK_SEED_CODER},
    {"ufakzeka", &PK_UFAKZEKA},
    {"laguna", &PK_LAGUNA},
    {"exaone-moe", &PK_EXAONE_MOE},
    {"minicpm5", &PK_MINICPM5},
    {"gemma4", &PK_GEMMA4}, {"granite-embed-multi-311m", &PK_GEMMA4},
};

const struct kiri_pre_kind *kiri_tokenizer_pre_find(const char *name)
{
    for (size_t k = 0; k < sizeof pre_table / sizeof pre_table[0]; k++)
        if (strcmp(pre_table[k].name, name) == 0)
            return pre_table[k].kind;
    return NULL;
}

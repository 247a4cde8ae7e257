#include "names.h"

#include <string.h>

static int name_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}

int kiri_model_name_ok(const char *s, size_t len)
{
    if (len == 0 || len > KIRI_MODEL_NAME_MAX || s[0] == '.')
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!name_char(s[i]))   /* a NUL inside len is refused here too */
            return 0;
    return 1;
}

int kiri_model_file_ok(const char *file)
{
    static const char ext[] = ".gguf";
    const size_t n = strlen(file), e = sizeof ext - 1;
    return n > e && memcmp(file + n - e, ext, e) == 0 && kiri_model_name_ok(file, n - e);
}

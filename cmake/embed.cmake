# Turns a file into a C source defining `const char NAME[]` (NUL-terminated) and
# `const size_t NAME_len`. Run as: cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* Generated from ${IN} by cmake/embed.cmake; do not edit. */\n#include <stddef.h>\n"
  "const char ${NAME}[] = {\n${body}0x00};\nconst size_t ${NAME}_len = ${bytes};\n")

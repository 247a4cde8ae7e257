/* The built-in chat page (server/chat_page.html), embedded at build time: one HTML file
 * with its script and style inline, no external assets. */
#ifndef KIRI_SERVER_CHAT_PAGE_H
#define KIRI_SERVER_CHAT_PAGE_H

#include <stddef.h>

extern const char kiri_chat_page_html[];     /* NUL-terminated */
extern const size_t kiri_chat_page_html_len; /* bytes, without the NUL */

#endif

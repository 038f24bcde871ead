/* See v4l_logic.h. */
#include "v4l_logic.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Quotes at most 80 bytes of `value` for an error message. */
static void excerpt(const char *value, char out[96]) {
    if (strlen(value) <= 80) {
        snprintf(out, 96, "\"%s\"", value);
    } else {
        snprintf(out, 96, "\"%.77s...\"", value);
    }
}

static int is_blank(const char *s) {
    for (; *s; s++) {
        if (!isspace((unsigned char)*s)) return 0;
    }
    return 1;
}

int v4l_parse_names(const char *value, struct v4l_names *out, char err[V4L_ERR_LEN]) {
    out->n = 0;
    if (value == NULL || is_blank(value)) return 0;
    char quoted[96];
    excerpt(value, quoted);
    const char *p = value;
    for (size_t entry = 1;; entry++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && isspace((unsigned char)*p)) { p++; len--; }
        while (len > 0 && isspace((unsigned char)p[len - 1])) len--;
        const char *why = NULL;
        if (len == 0) why = "is empty";
        else if (len >= V4L_NAME_LEN) why = "is longer than 63 bytes";
        else if (out->n == V4L_MAX_NAMES) why = "is one too many (at most 16 entries)";
        if (why) {
            snprintf(err, V4L_ERR_LEN,
                     "V4L_NAMES=%s is not valid: entry %zu (\"%.*s\") %s; expected a "
                     "comma-separated list of parts of device names, e.g. "
                     "\"Integrated Camera,C920\"; unset: every device",
                     quoted, entry, (int)(len > 40 ? 40 : len), p, why);
            return -1;
        }
        memcpy(out->names[out->n], p, len);
        out->names[out->n][len] = 0;
        out->n++;
        if (!end) return 0;
        p = end + 1;
    }
}

int v4l_name_matches(const struct v4l_names *filter, const char *name) {
    if (filter->n == 0) return 1;
    for (size_t i = 0; i < filter->n; i++) {
        if (strstr(name, filter->names[i]) != NULL) return 1;
    }
    return 0;
}

int v4l_parse_uint(const char *name, const char *value, uint32_t def, uint32_t min, uint32_t max,
                   uint32_t *out, char err[V4L_ERR_LEN]) {
    if (value == NULL) {
        *out = def;
        return 0;
    }
    const char *p = value;
    while (isspace((unsigned char)*p)) p++;
    int ok = isdigit((unsigned char)*p);
    char *end = NULL;
    errno = 0;
    unsigned long long v = ok ? strtoull(p, &end, 10) : 0;
    if (ok) {
        while (end && isspace((unsigned char)*end)) end++;
        ok = errno == 0 && end && *end == 0 && v >= min && v <= max;
    }
    if (!ok) {
        char quoted[96];
        excerpt(value, quoted);
        snprintf(err, V4L_ERR_LEN, "%s=%s is not valid: expected an integer from %u to %u (default %u)",
                 name, quoted, (unsigned)min, (unsigned)max, (unsigned)def);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

long v4l_video_number(const char *name) {
    if (strncmp(name, "video", 5) != 0) return -1;
    const char *d = name + 5;
    size_t n = 0;
    while (isdigit((unsigned char)d[n])) n++;
    if (n == 0 || n > 6 || d[n] != 0) return -1;
    return strtol(d, NULL, 10);
}

long v4l_parse_index(const char *text) {
    if (text == NULL) return -1;
    size_t n = 0;
    while (isdigit((unsigned char)text[n])) n++;
    if (n == 0 || n > 6) return -1;
    for (const char *q = text + n; *q; q++) {
        if (!isspace((unsigned char)*q)) return -1;
    }
    return strtol(text, NULL, 10);
}

const char *v4l_basename(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

void v4l_id(const char *key, char out[V4L_ID_LEN + 1]) {
    size_t i = 0;
    for (; key[i] && i < V4L_ID_LEN; i++) {
        char c = key[i];
        out[i] = (isalnum((unsigned char)c) || c == '.' || c == '_' || c == ':' || c == '-') ? c : '_';
    }
    if (i == 0) out[i++] = '_';
    out[i] = 0;
}

void v4l_trim(char *s) {
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
}

/* The pure part of the `v4l` scanner: parsing of configuration, names and ids.
 *
 * Why separate from v4l.c: nothing here touches the host (no bindings, no files), so
 * test_v4l_logic.c runs it with the build machine's own C compiler (`make test`). */
#ifndef WDP_V4L_LOGIC_H
#define WDP_V4L_LOGIC_H

#include <stddef.h>
#include <stdint.h>

/* Room for one error message naming the variable, the value and what is valid. */
#define V4L_ERR_LEN 512
/* Most entries V4L_NAMES may list, and the longest entry. */
#define V4L_MAX_NAMES 16
#define V4L_NAME_LEN 64
/* Longest device id kubelet accepts. */
#define V4L_ID_LEN 63

/* V4L_NAMES: parts of a device's name (sysfs `name` of its first node). */
struct v4l_names {
    size_t n; /* 0: no filter */
    char names[V4L_MAX_NAMES][V4L_NAME_LEN];
};

/* Parses V4L_NAMES: comma-separated parts of device names ("Integrated Camera,C920"), each 1 to
 * 63 bytes. NULL (unset) or blank: no filter. Returns 0, or -1 with `err` set. */
int v4l_parse_names(const char *value, struct v4l_names *out, char err[V4L_ERR_LEN]);

/* True when there is no filter or `name` contains one of the parts. */
int v4l_name_matches(const struct v4l_names *filter, const char *name);

/* Parses a decimal setting `name` in [min, max]; NULL (unset) gives `def`. Returns 0, or -1 with
 * `err` set. */
int v4l_parse_uint(const char *name, const char *value, uint32_t def, uint32_t min, uint32_t max,
                   uint32_t *out, char err[V4L_ERR_LEN]);

/* The number N of a node name "videoN" (digits only), or -1. */
long v4l_video_number(const char *name);

/* A small decimal sysfs attribute such as "0\n"; -1 when missing or malformed. */
long v4l_parse_index(const char *text);

/* The last component of a symlink target ("../../../1-6:1.0" -> "1-6:1.0"). */
const char *v4l_basename(const char *path);

/* `key` as a device id: at most 63 bytes, every byte outside [A-Za-z0-9._:-] replaced by '_'. An
 * empty key gives "_". */
void v4l_id(const char *key, char out[V4L_ID_LEN + 1]);

/* Trims trailing whitespace (a sysfs attribute's newline) in place. */
void v4l_trim(char *s);

#endif

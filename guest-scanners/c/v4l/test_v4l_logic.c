/* Unit tests of v4l_logic.c with the build machine's C compiler (`make test` runs them):
 *   cc -std=c11 -Wall -Wextra -Werror -o test_v4l_logic test_v4l_logic.c v4l_logic.c
 * Prints "N passed, 0 failed"; exits non-zero at the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "v4l_logic.h"

static int passed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            printf("%d passed, 1 failed\n", passed);                                 \
            exit(1);                                                                 \
        }                                                                            \
        passed++;                                                                    \
    } while (0)

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void names(void) {
    struct v4l_names f;
    char err[V4L_ERR_LEN] = "";
    CHECK(v4l_parse_names(NULL, &f, err) == 0 && f.n == 0);
    CHECK(v4l_parse_names(" ", &f, err) == 0 && f.n == 0);
    CHECK(v4l_name_matches(&f, "anything"));
    CHECK(v4l_parse_names("Integrated Camera, C920", &f, err) == 0 && f.n == 2);
    CHECK(strcmp(f.names[1], "C920") == 0);
    CHECK(v4l_name_matches(&f, "HD Pro Webcam C920"));
    CHECK(!v4l_name_matches(&f, "Dummy video device (0x0000)"));
    CHECK(v4l_parse_names("C920,", &f, err) == -1);
    CHECK(starts_with(err, "V4L_NAMES=\"C920,\" is not valid: entry 2 (\"\") is empty"));
    CHECK(strstr(err, "e.g. \"Integrated Camera,C920\"") != NULL);
    char long_name[100];
    memset(long_name, 'x', 70);
    long_name[70] = 0;
    CHECK(v4l_parse_names(long_name, &f, err) == -1 && strstr(err, "longer than 63 bytes"));
    CHECK(v4l_parse_names("a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", &f, err) == -1);
    CHECK(strstr(err, "entry 17 (\"q\") is one too many") != NULL);
}

static void uints(void) {
    uint32_t out = 0;
    char err[V4L_ERR_LEN] = "";
    CHECK(v4l_parse_uint("RESCAN_INTERVAL_MS", NULL, 30000, 1, 4294967295u, &out, err) == 0 && out == 30000);
    CHECK(v4l_parse_uint("RESCAN_INTERVAL_MS", " 250 ", 30000, 1, 4294967295u, &out, err) == 0 && out == 250);
    const char *bad[] = {"0", "-1", "x", "", "3x", "4294967296", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(v4l_parse_uint("RESCAN_INTERVAL_MS", bad[i], 30000, 1, 4294967295u, &out, err) == -1);
        char want[64];
        snprintf(want, sizeof want, "RESCAN_INTERVAL_MS=\"%s\" is not valid", bad[i]);
        CHECK(starts_with(err, want));
        CHECK(strstr(err, "expected an integer from 1 to 4294967295 (default 30000)") != NULL);
    }
}

static void attributes(void) {
    CHECK(v4l_video_number("video0") == 0);
    CHECK(v4l_video_number("video12") == 12);
    CHECK(v4l_video_number("video") == -1);
    CHECK(v4l_video_number("v4l-subdev0") == -1);
    CHECK(v4l_video_number("video1x") == -1);
    CHECK(v4l_parse_index("0\n") == 0);
    CHECK(v4l_parse_index("1") == 1);
    CHECK(v4l_parse_index("") == -1 && v4l_parse_index("-1") == -1 && v4l_parse_index(NULL) == -1);
    CHECK(strcmp(v4l_basename("../../../1-6:1.0"), "1-6:1.0") == 0);
    CHECK(strcmp(v4l_basename("video0"), "video0") == 0);
    char id[V4L_ID_LEN + 1];
    v4l_id("1-6:1.0", id);
    CHECK(strcmp(id, "1-6:1.0") == 0);
    v4l_id("a b/c", id);
    CHECK(strcmp(id, "a_b_c") == 0);
    v4l_id("", id);
    CHECK(strcmp(id, "_") == 0);
    char longkey[100];
    memset(longkey, 'k', 99);
    longkey[99] = 0;
    v4l_id(longkey, id);
    CHECK(strlen(id) == 63);
    char attr[] = "HD Pro Webcam C920\n";
    v4l_trim(attr);
    CHECK(strcmp(attr, "HD Pro Webcam C920") == 0);
}

int main(void) {
    names();
    uints();
    attributes();
    printf("%d passed, 0 failed\n", passed);
    return 0;
}

/* `{{name}}`: a wdp scanner, written in C. Every character device under /dev that matches
 * DEVICE_GLOB is one device of type `{{name}}` (kubelet sees the resource `<namespace>/{{name}}`),
 * given to the container that is allocated it at the same path.
 *
 * Health: a node is Healthy while the kernel lists its device number in sysfs
 * (/sys/dev/char/<major>:<minor>), Unhealthy when that is gone (a stale node whose driver went
 * away): kubelet stops allocating it, and it comes back Healthy on its own.
 *
 * What it reads, and how: /dev through the host's `devfs` interface (the generated bindings;
 * /dev is never preopened, so opendir("/dev") fails), /sys with plain POSIX calls (the host
 * preopens it read-only).
 *
 * Configuration (environment variables, set per scanner in the host's config):
 * - DEVICE_GLOB (default /dev/{{name}}*): the nodes to serve, a path under /dev whose last part may
 *   be a pattern (fnmatch: `*`, `?`, `[...]`);
 * - RESCAN_INTERVAL_MS (default 30000): the longest wait between scans; the host wakes the scanner
 *   as soon as /dev or /sys changes.
{{#post-allocator}}
 *
 * Its post-allocator tells each container which devices it got: {{NAME}}_DEVICES is the
 * comma-separated list of their ids.
{{/post-allocator}}
 */
#include <errno.h>
#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "{{world_c}}.h"

#define DEV_TYPE "{{name}}"
#define DEFAULT_GLOB "/dev/{{name}}*"
#define MAX_DEVICES 256
#define PATH_LEN 256
{{#post-allocator}}
#define DEVICES_ENV "{{NAME}}_DEVICES"
{{/post-allocator}}

typedef {{world_c}}_string_t wit_string;

/* Sets `err` to a formatted message (the host logs it: name the variable, value and what is
 * valid) and returns false. */
static bool fail(wit_string *err, const char *msg) {
    {{world_c}}_string_dup(err, msg);
    return false;
}

/* DEVICE_GLOB split into its directory and its last part; 0, or -1 with `msg` set. */
static int parse_glob(const char *value, char dir[PATH_LEN], char pattern[PATH_LEN], char msg[512]) {
    const char *glob = value ? value : DEFAULT_GLOB;
    const char *cut = strrchr(glob, '/');
    size_t dir_len = cut ? (size_t)(cut - glob) : 0;
    const char *wild = strpbrk(glob, "*?[");
    if (strncmp(glob, "/dev/", 5) != 0 || strstr(glob, "/..") || (wild && wild < cut) ||
        dir_len >= PATH_LEN || strlen(cut + 1) == 0 || strlen(cut + 1) >= PATH_LEN) {
        snprintf(msg, 512,
                 "DEVICE_GLOB=\"%s\" is not valid: expected a path under /dev with a pattern in its last "
                 "part only, e.g. " DEFAULT_GLOB,
                 glob);
        return -1;
    }
    memcpy(dir, glob, dir_len);
    dir[dir_len] = 0;
    snprintf(pattern, PATH_LEN, "%s", cut + 1);
    return 0;
}

/* RESCAN_INTERVAL_MS in ms; 0, or -1 with `msg` set. */
static int parse_rescan(const char *value, uint32_t *ms, char msg[512]) {
    if (!value) {
        *ms = 30000;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long n = strtoull(value, &end, 10);
    if (errno || end == value || *end || value[0] == '-' || n < 1 || n > UINT32_MAX) {
        snprintf(msg, 512, "RESCAN_INTERVAL_MS=\"%s\" is not valid: expected an integer from 1 to 4294967295", value);
        return -1;
    }
    *ms = (uint32_t)n;
    return 0;
}

/* The tree of the character devices in `dir` whose names match `pattern` (always one group,
 * maybe empty), and a fingerprint of it in `print` (equal fingerprints, equal trees). */
static wdp_device_plugin_types_device_tree_t scan_once(const char *dir, const char *pattern, char *print, size_t print_len) {
    wdp_device_plugin_types_device_tree_t tree = {.ptr = calloc(1, sizeof *tree.ptr), .len = 1};
    wdp_device_plugin_types_device_group_t *group = &tree.ptr[0];
    {{world_c}}_string_dup(&group->dev_type, DEV_TYPE);
    group->devices.ptr = calloc(MAX_DEVICES, sizeof *group->devices.ptr);
    print[0] = 0;

    wit_string path;
    {{world_c}}_string_set(&path, dir);
    wdp_device_plugin_devfs_list_node_t nodes;
    wit_string err;
    if (!wdp_device_plugin_devfs_read_dir(&path, &nodes, &err)) {
        {{world_c}}_string_free(&err); /* no such directory (yet): no devices */
        return tree;
    }
    size_t used = 0;
    for (size_t i = 0; i < nodes.len && group->devices.len < MAX_DEVICES; i++) {
        wdp_device_plugin_devfs_node_t *n = &nodes.ptr[i];
        char name[PATH_LEN], node_path[2 * PATH_LEN], sys[64];
        snprintf(name, sizeof name, "%.*s", (int)n->name.len, (const char *)n->name.ptr);
        if (n->kind != WDP_DEVICE_PLUGIN_DEVFS_NODE_KIND_CHAR_DEVICE || fnmatch(pattern, name, 0) != 0) continue;
        snprintf(node_path, sizeof node_path, "%s/%s", dir, name);
        snprintf(sys, sizeof sys, "/sys/dev/char/%u:%u", n->major, n->minor);
        struct stat st;
        bool known = stat(sys, &st) == 0;

        wdp_device_plugin_types_device_t *d = &group->devices.ptr[group->devices.len++];
        /* the id: the path below /dev, '/' turned into '_' */
        char id[2 * PATH_LEN];
        snprintf(id, sizeof id, "%s", node_path + strlen("/dev/"));
        for (char *c = id; *c; c++) if (*c == '/') *c = '_';
        {{world_c}}_string_dup(&d->id, id);
        d->info.health = known ? WDP_DEVICE_PLUGIN_TYPES_HEALTH_HEALTHY : WDP_DEVICE_PLUGIN_TYPES_HEALTH_UNHEALTHY;
        d->info.nodes.len = 1;
        d->info.nodes.ptr = calloc(1, sizeof *d->info.nodes.ptr);
        {{world_c}}_string_dup(&d->info.nodes.ptr[0].container_path, node_path);
        {{world_c}}_string_dup(&d->info.nodes.ptr[0].host_path, node_path);
        {{world_c}}_string_dup(&d->info.nodes.ptr[0].permissions, "rw");
        int w = snprintf(print + used, print_len - used, "%s=%d,", id, known);
        if (w > 0 && (size_t)w < print_len - used) used += (size_t)w;
    }
    wdp_device_plugin_devfs_list_node_free(&nodes);
    return tree;
}

/* The `scanner.scan` export: scan, notify when the tree changed, wait for a change, forever. An
 * error (a bad configuration) is returned: the host logs it and restarts the guest with backoff. */
bool exports_wdp_device_plugin_scanner_scan(wit_string *ret_err) {
    static char last[MAX_DEVICES * 2 * PATH_LEN], now[MAX_DEVICES * 2 * PATH_LEN];
    char dir[PATH_LEN], pattern[PATH_LEN], msg[512];
    uint32_t rescan_ms;
    if (parse_glob(getenv("DEVICE_GLOB"), dir, pattern, msg) != 0) return fail(ret_err, msg);
    if (parse_rescan(getenv("RESCAN_INTERVAL_MS"), &rescan_ms, msg) != 0) return fail(ret_err, msg);
    for (int first = 1;; first = 0) {
        wdp_device_plugin_types_device_tree_t tree = scan_once(dir, pattern, now, sizeof now);
        if (first || strcmp(now, last) != 0) {
            wdp_device_plugin_notifier_notify(&tree);
            memcpy(last, now, sizeof last);
        }
        wdp_device_plugin_types_device_tree_free(&tree);
        wdp_device_plugin_devfs_wait_for_change(rescan_ms);
    }
}
{{#post-allocator}}

/* The `post-allocator.post-allocate` export: adds each container's device ids to its response.
 * The arguments are ours to free; the answer is the responses themselves, extended. */
bool exports_wdp_device_plugin_post_allocator_post_allocate(
    wit_string *dev_type, exports_wdp_device_plugin_post_allocator_list_container_allocate_request_t *requests,
    exports_wdp_device_plugin_post_allocator_list_container_allocate_response_t *responses,
    exports_wdp_device_plugin_post_allocator_list_container_allocate_response_t *ret, wit_string *err) {
    (void)err;
    for (size_t i = 0; i < responses->len && i < requests->len; i++) {
        device_plugin_list_string_t *ids = &requests->ptr[i].device_ids;
        size_t len = 1;
        for (size_t j = 0; j < ids->len; j++) len += ids->ptr[j].len + 1;
        char *value = calloc(1, len);
        for (size_t j = 0; j < ids->len; j++) {
            if (j) strcat(value, ",");
            strncat(value, (const char *)ids->ptr[j].ptr, ids->ptr[j].len);
        }
        device_plugin_list_tuple2_string_string_t *envs = &responses->ptr[i].envs;
        envs->ptr = realloc(envs->ptr, (envs->len + 1) * sizeof *envs->ptr);
        device_plugin_string_dup(&envs->ptr[envs->len].f0, DEVICES_ENV);
        device_plugin_string_dup(&envs->ptr[envs->len].f1, value);
        envs->len++;
        free(value);
    }
    *ret = *responses;
    device_plugin_string_free(dev_type);
    exports_wdp_device_plugin_post_allocator_list_container_allocate_request_free(requests);
    return true;
}
{{/post-allocator}}

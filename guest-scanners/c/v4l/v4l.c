/* `v4l`: a wdp scanner for Video4Linux devices (cameras, capture cards, codecs), written in C.
 *
 * One physical device often has several nodes: a USB webcam gives /dev/video0 (capture) and
 * /dev/video1 (metadata), and a container needs both. So the device is the parent the nodes
 * share in sysfs, not the node: every /sys/class/video4linux/videoN whose `device` link names the
 * same parent (`1-6:1.0`, a USB interface; `0000:03:00.0`, a PCI function) is one device, with id
 * the parent's name (stable across the kernel renumbering videoN) and all its nodes. A node
 * without a parent (v4l2loopback's virtual devices) is a device of its own, id `videoN`. The
 * device's name is the sysfs `name` of its node with the lowest `index` (the main one).
 *
 * Built with Debian's clang and wasi-libc for wasm32-wasi (preview 1), bindings from
 * `wit-bindgen c` for world `scanner-plugin`, and made a component by `wasm-tools component new`
 * with the wasi_snapshot_preview1 reactor adapter (scripts/build-lang-guest.sh c v4l).
 *
 * What it reads, and how:
 * - /sys with plain POSIX (opendir/readdir, open/read, readlink): the host preopens it read-only;
 * - /dev through the host's `devfs` interface (stat only): a node udev has not created yet is
 *   left out until it appears (wait-for-change wakes the scanner then).
 *
 * Configuration (environment, per scanner in the host's config):
 * - V4L_NAMES (optional): comma-separated parts of device names, e.g. "Integrated Camera,C920";
 *   unset: every device;
 * - RESCAN_INTERVAL_MS (default 30000): longest wait between scans.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scanner_plugin.h"
#include "v4l_logic.h"

#define CLASS "/sys/class/video4linux"
#define DEV_TYPE "video"
#define MAX_NODES 128

struct node {
    long number;           /* N of videoN */
    long index;            /* sysfs `index`: 0 for a device's main node; -1 unknown */
    char key[V4L_ID_LEN + 1]; /* the parent's id, or videoN */
    char name[V4L_NAME_LEN];  /* sysfs `name` */
};

/* Reads a small sysfs attribute into buf, trimmed. Returns 0, or -1. */
static int read_attr(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = 0;
    v4l_trim(buf);
    return 0;
}

/* True when devfs says `path` is a character device. */
static int is_char_device(const char *path) {
    scanner_plugin_string_t p, err;
    wdp_device_plugin_devfs_node_t node;
    scanner_plugin_string_set(&p, path);
    if (!wdp_device_plugin_devfs_stat(&p, &node, &err)) {
        scanner_plugin_string_free(&err);
        return 0;
    }
    int ok = node.kind == WDP_DEVICE_PLUGIN_DEVFS_NODE_KIND_CHAR_DEVICE;
    wdp_device_plugin_devfs_node_free(&node);
    return ok;
}

/* Fills `n` for /sys/class/video4linux/<entry>; -1 when its /dev node is missing. */
static int describe(const char *entry, long number, struct node *n) {
    char path[160], buf[256];
    snprintf(path, sizeof path, "/dev/%s", entry);
    if (!is_char_device(path)) return -1;
    n->number = number;
    snprintf(path, sizeof path, CLASS "/%s/index", entry);
    n->index = read_attr(path, buf, sizeof buf) == 0 ? v4l_parse_index(buf) : -1;
    snprintf(path, sizeof path, CLASS "/%s/name", entry);
    if (read_attr(path, buf, sizeof buf) != 0) buf[0] = 0;
    snprintf(n->name, sizeof n->name, "%s", buf);
    snprintf(path, sizeof path, CLASS "/%s/device", entry);
    ssize_t len = readlink(path, buf, sizeof buf - 1);
    if (len > 0) {
        buf[len] = 0;
        v4l_id(v4l_basename(buf), n->key);
    } else {
        v4l_id(entry, n->key); /* no parent: a virtual device */
    }
    return 0;
}

static int by_key_then_number(const void *a, const void *b) {
    const struct node *x = a, *y = b;
    int d = strcmp(x->key, y->key);
    if (d) return d;
    return (x->number > y->number) - (x->number < y->number);
}

/* Lists the nodes, sorted by key then number. Returns their count, or -1 with err. */
static int find_nodes(struct node nodes[MAX_NODES], char *err, size_t errlen) {
    DIR *d = opendir(CLASS);
    if (!d) {
        if (errno == ENOENT) return 0; /* videodev not loaded: no devices */
        snprintf(err, errlen, "cannot list " CLASS ": %s", strerror(errno));
        return -1;
    }
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && count < MAX_NODES) {
        long number = v4l_video_number(e->d_name);
        if (number >= 0 && describe(e->d_name, number, &nodes[count]) == 0) count++;
    }
    closedir(d);
    qsort(nodes, (size_t)count, sizeof nodes[0], by_key_then_number);
    return count;
}

/* The name of the group nodes[from..to): its main node's (lowest index, then lowest number). */
static const char *group_name(const struct node *nodes, int from, int to) {
    int best = from;
    for (int i = from + 1; i < to; i++) {
        long bi = nodes[best].index < 0 ? 1L << 30 : nodes[best].index;
        long ii = nodes[i].index < 0 ? 1L << 30 : nodes[i].index;
        if (ii < bi) best = i;
    }
    return nodes[best].name;
}

static void fill_device(wdp_device_plugin_types_device_t *dev, const struct node *nodes, int from,
                        int to) {
    memset(dev, 0, sizeof *dev);
    scanner_plugin_string_dup(&dev->id, nodes[from].key);
    wdp_device_plugin_types_device_info_t *info = &dev->info;
    info->health = WDP_DEVICE_PLUGIN_TYPES_HEALTH_HEALTHY;
    info->nodes.len = (size_t)(to - from);
    info->nodes.ptr = calloc(info->nodes.len, sizeof *info->nodes.ptr);
    for (int i = from; i < to; i++) {
        char path[32];
        snprintf(path, sizeof path, "/dev/video%ld", nodes[i].number);
        wdp_device_plugin_types_device_spec_t *s = &info->nodes.ptr[i - from];
        scanner_plugin_string_dup(&s->container_path, path);
        scanner_plugin_string_dup(&s->host_path, path);
        scanner_plugin_string_dup(&s->permissions, "rw");
    }
}

/* The tree (always one group, `video`) and a fingerprint of it (equal fingerprints, equal
 * trees). Free the tree with wdp_device_plugin_types_device_tree_free. */
static wdp_device_plugin_types_device_tree_t build_tree(const struct v4l_names *filter,
                                                        const struct node *nodes, int count,
                                                        char *print, size_t print_size) {
    wdp_device_plugin_types_device_tree_t tree;
    tree.len = 1;
    tree.ptr = calloc(1, sizeof *tree.ptr);
    wdp_device_plugin_types_device_group_t *g = &tree.ptr[0];
    scanner_plugin_string_dup(&g->dev_type, DEV_TYPE);
    g->devices.ptr = count ? calloc((size_t)count, sizeof *g->devices.ptr) : NULL;
    size_t used = 0;
    print[0] = 0;
    for (int i = 0; i < count;) {
        int j = i;
        while (j < count && strcmp(nodes[j].key, nodes[i].key) == 0) j++;
        if (v4l_name_matches(filter, group_name(nodes, i, j))) {
            fill_device(&g->devices.ptr[g->devices.len++], nodes, i, j);
            for (int k = i; k < j && used < print_size; k++) {
                int n = snprintf(print + used, print_size - used, "%s/%ld,", nodes[k].key, nodes[k].number);
                if (n > 0) used += (size_t)n;
            }
        }
        i = j;
    }
    return tree;
}

static int read_config(struct v4l_names *filter, uint32_t *rescan_ms, char err[V4L_ERR_LEN]) {
    if (v4l_parse_names(getenv("V4L_NAMES"), filter, err) != 0) return -1;
    return v4l_parse_uint("RESCAN_INTERVAL_MS", getenv("RESCAN_INTERVAL_MS"), 30000, 1, UINT32_MAX,
                          rescan_ms, err);
}

/* The `scanner.scan` export: scan, notify when the tree changed, wait for a change, forever. An
 * error (bad configuration, unreadable /sys/class/video4linux) is returned: the host restarts the
 * guest with backoff and logs the message. */
bool exports_wdp_device_plugin_scanner_scan(scanner_plugin_string_t *ret_err) {
    static struct node nodes[MAX_NODES];
    static char last[MAX_NODES * 96], now[MAX_NODES * 96];
    static struct v4l_names filter;
    char err[V4L_ERR_LEN];
    uint32_t rescan_ms;
    if (read_config(&filter, &rescan_ms, err) != 0) {
        scanner_plugin_string_dup(ret_err, err);
        return false;
    }
    for (int first = 1;; first = 0) {
        int count = find_nodes(nodes, err, sizeof err);
        if (count < 0) {
            scanner_plugin_string_dup(ret_err, err);
            return false;
        }
        wdp_device_plugin_types_device_tree_t tree = build_tree(&filter, nodes, count, now, sizeof now);
        if (first || strcmp(now, last) != 0) {
            wdp_device_plugin_notifier_notify(&tree);
            memcpy(last, now, sizeof last);
        }
        wdp_device_plugin_types_device_tree_free(&tree);
        wdp_device_plugin_devfs_wait_for_change(rescan_ms);
    }
}

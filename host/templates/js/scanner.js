// The logic of the `{{name}}` scanner, free of host imports so `node --test` can test it.

export const DEV_TYPE = '{{name}}';
export const DEFAULT_GLOB = '/dev/{{name}}*';
{{#post-allocator}}
export const DEVICES_ENV = '{{NAME}}_DEVICES';
{{/post-allocator}}

/** DEVICE_GLOB (undefined: unset) as { dir, pattern: RegExp }; a bad one throws naming it. */
export function parseGlob(value) {
  const glob = value === undefined ? DEFAULT_GLOB : value;
  const cut = glob.lastIndexOf('/');
  const dir = glob.slice(0, cut);
  const last = glob.slice(cut + 1);
  if (!glob.startsWith('/dev/') || glob.split('/').includes('..') || /[*?[]/.test(dir) || last === '') {
    throw new Error(
      `DEVICE_GLOB=${JSON.stringify(glob)} is not valid: expected a path under /dev with a pattern in its last part only, e.g. ${DEFAULT_GLOB}`,
    );
  }
  const escaped = last.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.');
  return { dir, pattern: new RegExp(`^${escaped}$`) };
}

/** RESCAN_INTERVAL_MS (undefined: unset) in ms; a bad one throws naming it. */
export function parseRescan(value) {
  if (value === undefined) return 30000;
  const n = Number(value);
  if (!/^[0-9]+$/.test(value) || n < 1 || n > 4294967295) {
    throw new Error(`RESCAN_INTERVAL_MS=${JSON.stringify(value)} is not valid: expected an integer from 1 to 4294967295`);
  }
  return n;
}

/** Owner read and write: what a usable node grants. */
const OWNER_RW = 0o600;

/** The tree for the character devices `nodes` (devfs records) found in `glob.dir`. */
export function tree(glob, nodes) {
  const devices = nodes
    .filter((n) => glob.pattern.test(n.name))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    .map((n) => {
      const path = `${glob.dir}/${n.name}`;
      return {
        id: path.slice('/dev/'.length).replaceAll('/', '_'),
        info: {
          health: (n.mode & OWNER_RW) === OWNER_RW ? 'healthy' : 'unhealthy',
          nodes: [{ containerPath: path, hostPath: path, permissions: 'rw' }],
          mounts: [],
          envs: [],
          annotations: [],
          numaNodes: undefined,
          cdiDevices: [],
        },
      };
    });
  return [{ devType: DEV_TYPE, devices }];
}

/** Whether two trees are the same (notify only changes). */
export function sameTree(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}
{{#post-allocator}}

/** Adds each container's device ids to its response. */
export function postAllocate(requests, responses) {
  return responses.map((response, i) => ({
    ...response,
    envs: [...response.envs, [DEVICES_ENV, (requests[i]?.deviceIds ?? []).join(',')]],
  }));
}
{{/post-allocator}}

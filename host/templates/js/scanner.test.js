// Tests of the `{{name}}` scanner, with Node's own runner: `npm test` (node --test).
// The last one runs the built component over its fixture (fixture/) and wants exactly
// fixture/expected.json: build it first (`npm run build`); `wdp` comes from PATH, or from WDP.
// The fixture's device nodes are made with mknod, which needs root.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as scanner from './scanner.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const FIXTURE = join(HERE, 'fixture');

test('DEVICE_GLOB and RESCAN_INTERVAL_MS: defaults, and errors naming variable, value and what is valid', () => {
  assert.equal(scanner.parseGlob(undefined).dir, '/dev');
  assert.ok(scanner.parseGlob(undefined).pattern.test('{{name}}0'));
  assert.throws(() => scanner.parseGlob('/etc/*'), /^Error: DEVICE_GLOB="\/etc\/\*" is not valid/);
  assert.throws(() => scanner.parseGlob('/dev/*/x'), /pattern in its last part only/);
  assert.equal(scanner.parseRescan(undefined), 30000);
  assert.throws(() => scanner.parseRescan('soon'), /^Error: RESCAN_INTERVAL_MS="soon" is not valid/);
});

test('a node without owner read and write is unhealthy', () => {
  const node = (name, mode) => ({ name, kind: 'char-device', major: 240, minor: 0, mode });
  const [group] = scanner.tree(scanner.parseGlob(undefined), [node('{{name}}1', 0o000), node('{{name}}0', 0o660), node('other', 0o660)]);
  assert.deepEqual(group.devices.map((d) => [d.id, d.info.health]), [['{{name}}0', 'healthy'], ['{{name}}1', 'unhealthy']]);
});
{{#post-allocator}}

test('each container learns its device ids', () => {
  const [out] = scanner.postAllocate([{ deviceIds: ['{{name}}1', '{{name}}0'] }], [{ envs: [['A', '1']] }]);
  assert.deepEqual(out.envs, [['A', '1'], [scanner.DEVICES_ENV, '{{name}}1,{{name}}0']]);
});
{{/post-allocator}}

test('wdp scan over the fixture gives fixture/expected.json', () => {
  const component = process.env.COMPONENT ?? join(HERE, '{{name}}.wasm');
  assert.ok(existsSync(component), `${component} is missing: build it first (npm run build)`);
  const dev = mkdtempSync(join(tmpdir(), '{{name}}-fixture-dev-'));
  try {
    for (const line of readFileSync(join(FIXTURE, 'dev.txt'), 'utf8').split('\n')) {
      const fields = line.trim().split(/\s+/);
      if (fields[0] === '' || fields[0].startsWith('#')) continue;
      const [name, kind, major, minor, mode] = fields;
      execFileSync('mknod', ['-m', mode, join(dev, name), kind, major, minor]);
    }
    const out = spawnSync(process.env.WDP ?? 'wdp', [
      'scan', '--component', component, '--sys-root', join(FIXTURE, 'sys'), '--dev-root', dev,
      '--expect', join(FIXTURE, 'expected.json'),
    ], { encoding: 'utf8' });
    assert.equal(out.status, 0, `wdp scan over the fixture:\n${out.stdout}${out.stderr}${out.error ?? ''}`);
  } finally {
    rmSync(dev, { recursive: true, force: true });
  }
});

// Unit tests of sound.js with Node's own runner (`make test` runs them):
//   node --test guest-scanners/js/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as sound from './sound.js';

test('SOUND_MATCH, SOUND_SEQUENCER, RESCAN_INTERVAL_MS: values and errors naming variable, value and what is valid', () => {
  assert.equal(sound.parseMatch(undefined), null);
  assert.equal(sound.parseMatch(' '), null);
  assert.deepEqual(sound.parseMatch('Focusrite, USB_Audio'), ['Focusrite', 'USB_Audio']);
  assert.throws(() => sound.parseMatch('Focusrite,'), /^Error: SOUND_MATCH="Focusrite," is not valid: entry 2 \(""\) is empty; expected .*e\.g\. Focusrite,USB_Audio/);
  assert.throws(() => sound.parseMatch('a/b'), /entry 1 \("a\/b"\) contains '\/'/);
  assert.equal(sound.parseSequencer(undefined), false);
  assert.equal(sound.parseSequencer('true'), true);
  assert.throws(() => sound.parseSequencer('yes'), /^Error: SOUND_SEQUENCER="yes" is not valid: expected true or false/);
  assert.equal(sound.parseRescanInterval(undefined), 30000);
  assert.equal(sound.parseRescanInterval('15'), 15);
  for (const bad of ['0', '-5', '1.5', 'soon', '4294967296']) {
    assert.throws(() => sound.parseRescanInterval(bad), /^Error: RESCAN_INTERVAL_MS=".*" is not valid: expected an integer from 1 to 4294967295/);
  }
});

test('node names and by-id links', () => {
  for (const [name, card] of [['controlC0', 0], ['pcmC12D3p', 12], ['pcmC1D0c', 1], ['hwC2D0', 2], ['midiC3D1', 3], ['comprC4D0', 4]]) {
    assert.equal(sound.cardOf(name), card, name);
  }
  for (const name of ['timer', 'seq', 'controlC', 'pcmC1D0', 'pcmC1D0x', 'controlC1D0', 'by-id']) {
    assert.equal(sound.cardOf(name), null, name);
  }
  assert.equal(sound.byIdCard('../controlC3'), 3);
  assert.equal(sound.byIdCard('/dev/snd/controlC0'), 0);
  for (const bad of ['../pcmC0D0p', '../../controlC0', 'controlC0', '../controlC']) assert.equal(sound.byIdCard(bad), null, bad);
});

const NODES = ['controlC1', 'pcmC1D0p', 'controlC0', 'pcmC0D0c', 'hwC0D0', 'pcmC2D0p', 'timer', 'seq'];

test('one device per card with a control node; shared timer; sequencer on request; filters', () => {
  const byId = new Map([[1, 'usb-Focusrite_Scarlett_2i2_USB-00']]);
  const g = sound.group(NODES, byId);
  assert.equal(g.devType, 'sound');
  assert.deepEqual(g.devices.map((d) => d.id), ['card0', 'card1']); // card2 has no control node
  assert.deepEqual(g.devices[0].info.nodes.map((n) => n.hostPath), ['/dev/snd/controlC0', '/dev/snd/hwC0D0', '/dev/snd/pcmC0D0c', '/dev/snd/timer']);
  assert.deepEqual(g.devices[0].info.envs, [['ALSA_CARD', '0']]);
  assert.deepEqual(g.devices[0].info.annotations, []);
  assert.deepEqual(g.devices[1].info.annotations, [['sound.wdp.dev/card1', 'usb-Focusrite_Scarlett_2i2_USB-00']]);
  const withSeq = sound.group(NODES, byId, { sequencer: true });
  assert.deepEqual(withSeq.devices[1].info.nodes.map((n) => n.containerPath).slice(-2), ['/dev/snd/timer', '/dev/snd/seq']);
  assert.deepEqual(sound.group(NODES, byId, { match: ['Scarlett'] }).devices.map((d) => d.id), ['card1']);
  assert.deepEqual(sound.group(NODES, byId, { match: ['Behringer'] }).devices, []);
  assert.deepEqual(sound.group([], byId).devices, []);
});

const response = (cards, envs) => ({
  envs,
  mounts: [],
  devices: cards.flatMap((c) => [`/dev/snd/controlC${c}`, `/dev/snd/pcmC${c}D0p`, '/dev/snd/timer']).map((p) => ({ containerPath: p, hostPath: p, permissions: 'rw' })),
  annotations: [],
  cdiDevices: [],
});

test('post-allocate: ALSA_CARD is the first card in kubelet order, SOUND_CARDS lists all', () => {
  const out = sound.postAllocate(
    'sound',
    [{ deviceIds: ['card3', 'card1'] }, { deviceIds: [] }],
    // the host's default: the last device's ALSA_CARD wins
    [response([3, 1], [['ALSA_CARD', '1'], ['KEEP', 'x']]), response([], [])],
  );
  assert.deepEqual(out[0].envs, [['KEEP', 'x'], ['ALSA_CARD', '3'], ['SOUND_CARDS', '3,1']]);
  assert.equal(out[0].devices.length, 6);
  assert.deepEqual(out[1].envs, [['SOUND_CARDS', '']]);
  assert.throws(() => sound.postAllocate('gpu', [], []), /serves only "sound"/);
  assert.throws(() => sound.postAllocate('sound', [{ deviceIds: [] }], []), /1 requests but 0 responses/);
});

//! ListAndWatch's message, encoded once per update of a resource and sent as it is by every
//! stream of it.
//!
//! Why: a resource of 10,000 devices sends kubelet a list of 10,000 devices at every update,
//! whatever changed. Built as prost's generated message it is 20,000 strings allocated, encoded,
//! and freed again, per stream and per comparison with the list before. [`ListEncoder`] writes
//! the message's bytes straight from the owner's devices, once per update; the server compares
//! those bytes with the last ones and hands them to each stream, and tonic copies them into its
//! frame. The message type is the proto's own (the generated code refers to this one), so a
//! client such as the stand-in decodes it into [`ListAndWatchResponse::devices`] as before.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{self, DecodeContext, WireType};

use crate::api;

/// The `devices` field's number in `ListAndWatchResponse`.
const DEVICES: u32 = 1;

/// `v1beta1.ListAndWatchResponse`: the devices a client decoded (or a server built), and the
/// encoding of more, which is sent after them as the same repeated field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListAndWatchResponse {
    /// The devices, as decoded.
    pub devices: Vec<api::Device>,
    /// More devices, already encoded as the message's field ([`ListEncoder`]); never filled by
    /// decoding.
    encoded: Bytes,
}

impl ListAndWatchResponse {
    /// The message whose devices are `encoded` ([`ListEncoder::finish`]).
    pub fn from_encoded(encoded: Bytes) -> Self {
        ListAndWatchResponse {
            devices: Vec::new(),
            encoded,
        }
    }
}

impl prost::Message for ListAndWatchResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encoding::message::encode_repeated(DEVICES, &self.devices, buf);
        buf.put_slice(&self.encoded);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl bytes::Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if tag == DEVICES {
            encoding::message::merge_repeated(wire_type, &mut self.devices, buf, ctx)
        } else {
            encoding::skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::message::encoded_len_repeated(DEVICES, &self.devices) + self.encoded.len()
    }

    fn clear(&mut self) {
        self.devices.clear();
        self.encoded = Bytes::new();
    }
}

/// Writes a ListAndWatch message device by device, byte for byte what prost encodes for the
/// same [`api::Device`]s, without making them.
#[derive(Debug, Default)]
pub struct ListEncoder {
    buf: BytesMut,
}

/// A string field's length on the wire, key and length included; 0 for an empty one, which
/// proto3 leaves out.
fn text_len(tag: u32, text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    encoding::key_len(tag) + encoding::encoded_len_varint(text.len() as u64) + text.len()
}

fn put_text(tag: u32, text: &str, buf: &mut BytesMut) {
    if text.is_empty() {
        return;
    }
    encoding::encode_key(tag, WireType::LengthDelimited, buf);
    encoding::encode_varint(text.len() as u64, buf);
    buf.put_slice(text.as_bytes());
}

impl ListEncoder {
    /// An empty list with room for about `devices` devices.
    pub fn with_capacity(devices: usize) -> Self {
        ListEncoder {
            buf: BytesMut::with_capacity(devices.saturating_mul(24)),
        }
    }

    /// Adds device `id` with `health` and, when it has any, its `topology`.
    pub fn push(&mut self, id: &str, health: &str, topology: Option<&api::TopologyInfo>) {
        let len = text_len(1, id)
            + text_len(2, health)
            + topology.map_or(0, |t| encoding::message::encoded_len(3, t));
        encoding::encode_key(DEVICES, WireType::LengthDelimited, &mut self.buf);
        encoding::encode_varint(len as u64, &mut self.buf);
        put_text(1, id, &mut self.buf);
        put_text(2, health, &mut self.buf);
        if let Some(topology) = topology {
            encoding::message::encode(3, topology, &mut self.buf);
        }
    }

    /// The devices' encoding, for [`ListAndWatchResponse::from_encoded`].
    pub fn finish(self) -> Bytes {
        self.buf.freeze()
    }
}

/// The encoding of `devices`, as [`ListEncoder`] writes it.
pub fn encode(devices: &[api::Device]) -> Bytes {
    let mut list = ListEncoder::with_capacity(devices.len());
    for d in devices {
        list.push(&d.id, &d.health, d.topology.as_ref());
    }
    list.finish()
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn device(id: &str, health: &str, numa: &[i64]) -> api::Device {
        api::Device {
            id: id.into(),
            health: health.into(),
            topology: (!numa.is_empty()).then(|| api::TopologyInfo {
                nodes: numa.iter().map(|&id| api::NumaNode { id }).collect(),
            }),
        }
    }

    #[test]
    fn the_encoding_is_prost_s_and_decodes_to_the_devices() {
        let devices = vec![
            device("d0", "Healthy", &[]),
            device("gpu-1", "Unhealthy", &[0, 1]),
            device("", "", &[3]),
            device(&"x".repeat(300), "Healthy", &[]),
        ];
        let made = ListAndWatchResponse {
            devices: devices.clone(),
            encoded: Bytes::new(),
        };
        let sent = ListAndWatchResponse::from_encoded(encode(&devices));
        assert_eq!(sent.encode_to_vec(), made.encode_to_vec());
        assert_eq!(sent.encoded_len(), made.encoded_len());
        let got = ListAndWatchResponse::decode(sent.encode_to_vec().as_slice()).unwrap();
        assert_eq!(got.devices, devices);
        assert!(
            ListAndWatchResponse::from_encoded(encode(&[]))
                .encode_to_vec()
                .is_empty()
        );
    }
}

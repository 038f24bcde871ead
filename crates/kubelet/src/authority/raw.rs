//! A header block with its Huffman-coded strings written raw, before the HPACK decoder reads it.
//!
//! Why: the decoder (`loona-hpack`) builds a hash table of the 257 Huffman codes for every
//! Huffman-coded string it meets and looks each bit up in it. A request's `:path` is such a
//! string in every request from h2's encoder (tonic's clients), which never indexes it: that was
//! a few percent of the host's CPU per gRPC call. The code is canonical (RFC 7541 Appendix B assigns codes in order of
//! length, then symbol), so it is decoded here from the code lengths alone, with no table built
//! per string. The decoder then reads the same fields, only raw: it checks, indexes and counts
//! them as before, and what it hands on is the same.

/// The Huffman code's length in bits for each symbol, 256 being EOS (RFC 7541 Appendix B).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

/// The longest code.
const LONGEST: usize = 30;

/// EOS, which may not appear in a string.
const EOS: u16 = 256;

/// The canonical code laid out for decoding: per length, its first code, how many codes it has
/// and where its symbols start in `symbols`, which holds them by length, then symbol.
struct Code {
    first: [u32; LONGEST + 1],
    count: [u32; LONGEST + 1],
    start: [usize; LONGEST + 1],
    symbols: [u16; 257],
}

const CODE: Code = {
    let mut code = Code {
        first: [0; LONGEST + 1],
        count: [0; LONGEST + 1],
        start: [0; LONGEST + 1],
        symbols: [0; 257],
    };
    let mut s = 0;
    while s < LENGTHS.len() {
        code.count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let (mut next, mut at, mut len) = (0u32, 0usize, 1);
    while len <= LONGEST {
        code.first[len] = next;
        code.start[len] = at;
        let mut s = 0;
        while s < LENGTHS.len() {
            if LENGTHS[s] as usize == len {
                code.symbols[at] = s as u16;
                at += 1;
            }
            s += 1;
        }
        next = (next + code.count[len]) << 1;
        len += 1;
    }
    code
};

/// Why a header block could not be read; the decoder refuses the same blocks.
#[derive(Debug, thiserror::Error)]
pub(super) enum Malformed {
    /// An integer that runs past the block or over five octets.
    #[error("an integer cut short or over five octets")]
    Integer,
    /// A string longer than what is left of the block.
    #[error("a string past the end of the block")]
    String,
    /// A Huffman-coded string with EOS in it, or padding that is not EOS's first bits.
    #[error("a Huffman-coded string with EOS or bad padding")]
    Huffman,
}

/// Appends `block` to `out` with every Huffman-coded string (a literal field's name or value)
/// written raw; every other byte is copied.
pub(super) fn unhuffman(mut block: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    while let Some(&first) = block.first() {
        // The field's kind, from its first bits: the integer's prefix, and whether strings
        // follow (RFC 7541 6.1 to 6.3).
        let (prefix, literal) = if first & 0x80 != 0 {
            (7, false)
        } else if first & 0x40 != 0 {
            (6, true)
        } else if first & 0x20 != 0 {
            (5, false)
        } else {
            (4, true)
        };
        let (index, used) = integer(block, prefix)?;
        out.extend_from_slice(&block[..used]);
        block = &block[used..];
        if literal {
            if index == 0 {
                block = string(block, out)?;
            }
            block = string(block, out)?;
        }
    }
    Ok(())
}

/// The integer at the start of `buf` with a `prefix`-bit prefix, and its length; five octets at
/// most, as the decoder allows.
fn integer(buf: &[u8], prefix: u8) -> Result<(usize, usize), Malformed> {
    let mask = (1u8 << prefix) - 1;
    let first = buf.first().ok_or(Malformed::Integer)? & mask;
    let mut value = usize::from(first);
    if first < mask {
        return Ok((value, 1));
    }
    for (i, &b) in buf.iter().enumerate().skip(1).take(4) {
        value += usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    Err(Malformed::Integer)
}

/// Appends the string at the start of `buf` to `out`, raw, and returns what follows it.
fn string<'a>(buf: &'a [u8], out: &mut Vec<u8>) -> Result<&'a [u8], Malformed> {
    let (len, used) = integer(buf, 7)?;
    let end = used.checked_add(len).ok_or(Malformed::String)?;
    let text = buf.get(used..end).ok_or(Malformed::String)?;
    if buf[0] & 0x80 == 0 {
        out.extend_from_slice(&buf[..end]);
        return Ok(&buf[end..]);
    }
    // The length goes before the text and is known only once it is decoded: decoded at the
    // end of `out`, then moved up behind its length.
    let at = out.len();
    huffman(text, out)?;
    let decoded = out.len() - at;
    let mut head = Vec::with_capacity(5);
    // Writing to a Vec cannot fail.
    let _ = loona_hpack::encoder::encode_integer_into(decoded, 7, 0, &mut head);
    out.splice(at..at, head);
    Ok(&buf[end..])
}

/// Appends the symbols Huffman-coded in `text` to `out`.
fn huffman(text: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in text {
        for bit in (0..8).rev() {
            code = code << 1 | u32::from(byte >> bit & 1);
            len += 1;
            // Every code of this length is in [first, first + count): a symbol.
            let offset = code.wrapping_sub(CODE.first[len]);
            if offset < CODE.count[len] {
                let symbol = CODE.symbols[CODE.start[len] + offset as usize];
                if symbol == EOS {
                    return Err(Malformed::Huffman);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // Left over: fewer than 8 bits, all ones (EOS's first bits).
    if len > 7 || code != (1 << len) - 1 {
        return Err(Malformed::Huffman);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small pseudo-random generator (xorshift): inputs that are the same at every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn bytes(&mut self, max: usize) -> Vec<u8> {
            let n = self.next() as usize % (max + 1);
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// `text` Huffman-coded, padded with ones.
    fn encode(text: &[u8]) -> Vec<u8> {
        let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
        for &b in text {
            let len = LENGTHS[usize::from(b)];
            let start = CODE.start[usize::from(len)];
            let rank = CODE.symbols[start..]
                .iter()
                .position(|&s| s == u16::from(b))
                .unwrap();
            let code = CODE.first[usize::from(len)] + rank as u32;
            acc = acc << len | u64::from(code);
            bits += u32::from(len);
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push((acc << (8 - bits)) as u8 | (0xff >> bits));
        }
        out
    }

    /// Our decoding and the HPACK decoder's own agree, answer and refusal alike.
    fn same(text: &[u8]) {
        let mut ours = Vec::new();
        let ours = huffman(text, &mut ours).map(|()| ours).ok();
        let theirs = loona_hpack::huffman::HuffmanDecoder::new()
            .decode(text)
            .ok();
        assert_eq!(ours, theirs, "{text:02x?}");
    }

    #[test]
    fn decodes_as_the_hpack_decoder_does() {
        same(&[]);
        // EOS (30 ones) first, and after an `a`.
        same(&[0xff; 4]);
        same(&[0x1f, 0xff, 0xff, 0xff, 0xff]);
        for a in 0..=255u8 {
            same(&[a]);
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..5_000 {
            same(&rng.bytes(40));
            let text = rng.bytes(60);
            let coded = encode(&text);
            same(&coded);
            let mut decoded = Vec::new();
            huffman(&coded, &mut decoded).unwrap();
            assert_eq!(decoded, text);
        }
    }

    /// A string field: raw or Huffman-coded, its length's integer as given.
    fn put_string(text: &[u8], coded: bool, out: &mut Vec<u8>) {
        let body = if coded { encode(text) } else { text.to_vec() };
        loona_hpack::encoder::encode_integer_into(body.len(), 7, if coded { 0x80 } else { 0 }, out)
            .unwrap();
        out.extend_from_slice(&body);
    }

    #[test]
    fn a_block_decodes_to_the_same_fields_raw() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..2_000 {
            // Fields of every kind, names and values raw or coded, indices into the static
            // table and the dynamic one.
            let mut block = Vec::new();
            for _ in 0..rng.next() % 12 {
                let kind = rng.next() % 5;
                let index = (rng.next() % 70) as usize;
                let (flags, prefix) =
                    [(0x80, 7), (0x40, 6), (0x20, 5), (0x00, 4), (0x10, 4)][kind as usize];
                let index = if kind == 0 { index.max(1) } else { index };
                let index = if kind == 2 { index * 60 } else { index };
                loona_hpack::encoder::encode_integer_into(index, prefix, flags, &mut block)
                    .unwrap();
                if flags & 0xa0 == 0 {
                    if index == 0 {
                        put_string(&rng.bytes(10), rng.next() & 1 == 0, &mut block);
                    }
                    put_string(&rng.bytes(30), rng.next() & 1 == 0, &mut block);
                }
            }
            // Sometimes cut short or with a byte changed.
            match rng.next() % 4 {
                0 if !block.is_empty() => {
                    block.truncate(rng.next() as usize % block.len());
                }
                1 if !block.is_empty() => {
                    let i = rng.next() as usize % block.len();
                    block[i] = rng.next() as u8;
                }
                _ => {}
            }
            same_fields(&block);
        }
        // A coded value's length (128) written long: in five octets, then in six, which the
        // decoder refuses.
        let value = encode(&[b'a'; 204]);
        assert_eq!(value.len(), 128);
        for length in [
            &[0xff, 0x81, 0x80, 0x80, 0x00][..],
            &[0xff, 0x81, 0x80, 0x80, 0x80, 0x00],
        ] {
            let mut block = vec![0x04];
            block.extend_from_slice(length);
            block.extend_from_slice(&value);
            same_fields(&block);
        }
    }

    /// The decoder reads `block` and `block` with its strings raw alike, answer and refusal.
    fn same_fields(block: &[u8]) {
        let mut raw = Vec::new();
        let raw = unhuffman(block, &mut raw).map(|()| raw);
        let theirs = loona_hpack::Decoder::new().decode(block).ok();
        let ours = raw
            .ok()
            .and_then(|raw| loona_hpack::Decoder::new().decode(&raw).ok());
        assert_eq!(ours, theirs, "{block:02x?}");
    }
}

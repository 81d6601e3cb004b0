//! A minimal Python pickle writer (protocol 4, unframed): ints, strings, bools, lists,
//! dicts and 2-tuples, written as a stream of opcodes.
//!
//! Only opcodes that both Python's `pickle` and PyTorch's memory_viz page (its own small
//! unpickler in `MemoryViz.js`) read are used: `PROTO`, `BININT1/2`, `BININT`, `LONG1`,
//! `SHORT_BINUNICODE`, `BINUNICODE`, `NEWTRUE/NEWFALSE`, `EMPTY_LIST`, `EMPTY_DICT`,
//! `MARK`, `APPENDS`, `SETITEMS`, `TUPLE2`, `BINPUT/LONG_BINPUT`, `BINGET/LONG_BINGET`,
//! `STOP`. Frames (`FRAME`) are optional in protocol 4 and left out. Strings are memoized by
//! value, so repeated dict keys cost two bytes, as in a pickle Python writes.

use std::collections::HashMap;

pub(crate) mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const EMPTY_LIST: u8 = b']';
    pub const EMPTY_DICT: u8 = b'}';
    pub const MARK: u8 = b'(';
    pub const APPENDS: u8 = b'e';
    pub const SETITEMS: u8 = b'u';
    pub const TUPLE2: u8 = 0x86;
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

/// Items per `APPENDS` / `SETITEMS` batch (Python's pickler uses the same), which also keeps
/// the JavaScript reader's `push(...items)` small.
pub(crate) const BATCH: usize = 1000;

/// A memo slot, for writing an object once and referring to it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Memo(u32);

/// Writes one pickled object: call the value methods in the order a pickle lists them, then
/// [`Pickler::finish`].
pub(crate) struct Pickler {
    out: Vec<u8>,
    strings: HashMap<String, Memo>,
    next_memo: u32,
}

impl Pickler {
    pub fn new() -> Self {
        Self { out: vec![op::PROTO, 4], strings: HashMap::new(), next_memo: 0 }
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(op::STOP);
        self.out
    }

    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { op::NEWTRUE } else { op::NEWFALSE });
    }

    /// The smallest encoding, as Python's pickler chooses it.
    pub fn int(&mut self, v: i128) {
        if (0..=0xff).contains(&v) {
            self.out.extend([op::BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, as few bytes as keep the sign.
            let bytes = v.to_le_bytes();
            let mut n = bytes.len();
            while n > 1 {
                let (top, next) = (bytes[n - 1], bytes[n - 2]);
                let redundant = (top == 0x00 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
                if !redundant {
                    break;
                }
                n -= 1;
            }
            self.out.extend([op::LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    pub fn str(&mut self, s: &str) {
        if let Some(&m) = self.strings.get(s) {
            self.get(m);
            return;
        }
        let b = s.as_bytes();
        if b.len() < 256 {
            self.out.extend([op::SHORT_BINUNICODE, b.len() as u8]);
        } else {
            self.out.push(op::BINUNICODE);
            self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(b);
        let m = self.put();
        self.strings.insert(s.to_string(), m);
    }

    /// Memoize the object on top of the stack.
    pub fn put(&mut self) -> Memo {
        let m = Memo(self.next_memo);
        self.next_memo += 1;
        if m.0 < 256 {
            self.out.extend([op::BINPUT, m.0 as u8]);
        } else {
            self.out.push(op::LONG_BINPUT);
            self.out.extend_from_slice(&m.0.to_le_bytes());
        }
        m
    }

    /// Push a memoized object again (the same object, as Python shares it).
    pub fn get(&mut self, m: Memo) {
        if m.0 < 256 {
            self.out.extend([op::BINGET, m.0 as u8]);
        } else {
            self.out.push(op::LONG_BINGET);
            self.out.extend_from_slice(&m.0.to_le_bytes());
        }
    }

    /// A list of `items`, each written by `item`.
    pub fn list<T>(&mut self, items: impl IntoIterator<Item = T>, mut item: impl FnMut(&mut Self, T)) {
        self.out.push(op::EMPTY_LIST);
        let mut in_batch = 0;
        for x in items {
            if in_batch == 0 {
                self.out.push(op::MARK);
            }
            item(self, x);
            in_batch += 1;
            if in_batch == BATCH {
                self.out.push(op::APPENDS);
                in_batch = 0;
            }
        }
        if in_batch > 0 {
            self.out.push(op::APPENDS);
        }
    }

    /// A dict with string keys; `body` writes `key(...)` then the value, for every item.
    pub fn dict(&mut self, body: impl FnOnce(&mut DictWriter<'_>)) {
        self.out.extend([op::EMPTY_DICT, op::MARK]);
        let mut d = DictWriter { p: self, items: 0 };
        body(&mut d);
        self.out.push(op::SETITEMS);
    }

    /// A 2-tuple of ints.
    pub fn tuple2(&mut self, a: i128, b: i128) {
        self.int(a);
        self.int(b);
        self.out.push(op::TUPLE2);
    }
}

/// Writes a dict's items (see [`Pickler::dict`]).
pub(crate) struct DictWriter<'a> {
    pub p: &'a mut Pickler,
    items: usize,
}

impl DictWriter<'_> {
    /// Start an item: the key; write its value next with `self.p`.
    pub fn key(&mut self, k: &str) -> &mut Pickler {
        if self.items > 0 && self.items.is_multiple_of(BATCH) {
            self.p.out.extend([op::SETITEMS, op::MARK]);
        }
        self.items += 1;
        self.p.str(k);
        self.p
    }

    pub fn int(&mut self, k: &str, v: i128) {
        self.key(k).int(v);
    }

    pub fn str(&mut self, k: &str, v: &str) {
        self.key(k).str(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"a": [1, 300, -2, 2**40, "a"], "b": (0, 0), "c": False, "d": True}`, byte by byte: the
    /// layout Python's `pickle` reads (checked against `pickle.loads` in the memory_viz tests).
    #[test]
    fn a_tiny_pickle_has_the_expected_bytes() {
        let mut p = Pickler::new();
        p.dict(|d| {
            d.key("a").list([0i128, 1, 2, 3, 4], |p, i| match i {
                0 => p.int(1),
                1 => p.int(300),
                2 => p.int(-2),
                3 => p.int(1 << 40),
                _ => p.str("a"),
            });
            d.key("b").tuple2(0, 0);
            d.key("c").bool(false);
            d.key("d").bool(true);
        });
        let bytes = p.finish();
        let expected: Vec<u8> = [
            &[0x80, 4, b'}', b'('][..],
            &[0x8c, 1, b'a', b'q', 0], // "a", memo 0
            &[b']', b'(', b'K', 1, b'M', 0x2c, 0x01, b'J', 0xfe, 0xff, 0xff, 0xff],
            &[0x8a, 6, 0, 0, 0, 0, 0, 1], // 2**40: six bytes, the top one 0x01
            &[b'h', 0, b'e'],             // "a" again from the memo, APPENDS
            &[0x8c, 1, b'b', b'q', 1, b'K', 0, b'K', 0, 0x86],
            &[0x8c, 1, b'c', b'q', 2, 0x89],
            &[0x8c, 1, b'd', b'q', 3, 0x88],
            b"u.",
        ]
        .concat();
        assert_eq!(bytes, expected);
    }

    #[test]
    fn long_ints_keep_their_sign_in_as_few_bytes_as_python() {
        let enc = |v: i128| {
            let mut p = Pickler::new();
            p.int(v);
            p.finish()[2..].to_vec()
        };
        // 0x80_0000_0000: the top byte has its high bit set, so a zero byte follows.
        assert_eq!(enc(0x80_0000_0000), [0x8a, 6, 0, 0, 0, 0, 0x80, 0, b'.']);
        assert_eq!(enc(-(1 << 40)), [0x8a, 6, 0, 0, 0, 0, 0, 0xff, b'.']);
        assert_eq!(enc(0x7fff_ffff), [b'J', 0xff, 0xff, 0xff, 0x7f, b'.']);
        assert_eq!(enc(0x8000_0000), [0x8a, 5, 0, 0, 0, 0x80, 0, b'.']);
    }

    #[test]
    fn long_lists_and_dicts_are_batched_by_a_thousand() {
        let mut p = Pickler::new();
        p.list(0..2500, |p, _| p.bool(true));
        let b = p.finish();
        assert_eq!(b.iter().filter(|&&x| x == op::APPENDS).count(), 3);
        assert_eq!(b.iter().filter(|&&x| x == op::MARK).count(), 3);
    }
}

//! Minimal ISO-BMFF (mp4) demuxer: finds the first AV1 video track and builds its
//! sample table (file offset, size, presentation time, sync flag). Every length and
//! count read from the file is bounds-checked; malformed input gives an error string.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// One coded sample (an AV1 temporal unit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mp4Sample {
    pub offset: u64,
    pub size: u32,
    /// Presentation time in seconds (edit list applied).
    pub pts: f64,
    pub sync: bool,
}

/// The AV1 track of an mp4 file.
#[derive(Debug, Clone)]
pub struct Av1Track {
    pub width: u32,
    pub height: u32,
    pub timescale: u32,
    /// `configOBUs` of the av1C box (usually the sequence header).
    pub config_obus: Vec<u8>,
    /// Samples in decode order (== presentation order for AV1).
    pub samples: Vec<Mp4Sample>,
}

type R<T> = Result<T, String>;

struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Cur<'a> {
    fn new(b: &'a [u8]) -> Self {
        Cur { b, p: 0 }
    }
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let end = self.p.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("box truncated")?;
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> R<u16> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> R<u64> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn remaining(&self) -> usize {
        self.b.len() - self.p
    }
    /// Entry count that must fit in the rest of the box at `entry_size` bytes each.
    fn count(&mut self, entry_size: usize) -> R<usize> {
        let n = self.u32()? as usize;
        if n.checked_mul(entry_size).is_none_or(|t| t > self.remaining()) {
            return Err(format!("entry count {n} exceeds box size"));
        }
        Ok(n)
    }
}

/// Iterate child boxes of a payload: yields (fourcc, payload).
fn boxes(b: &[u8]) -> R<Vec<([u8; 4], &[u8])>> {
    let mut out = Vec::new();
    let mut c = Cur::new(b);
    while c.remaining() >= 8 {
        let size = c.u32()? as u64;
        let typ: [u8; 4] = c.take(4)?.try_into().unwrap();
        let (hdr, size) = match size {
            0 => (8u64, (c.remaining() + 8) as u64),
            1 => (16u64, c.u64()?),
            s => (8u64, s),
        };
        if size < hdr {
            return Err(format!("box {:?} has invalid size {size}", String::from_utf8_lossy(&typ)));
        }
        let body = usize::try_from(size - hdr).map_err(|_| "box too large")?;
        let payload = c.take(body).map_err(|_| format!("box {:?} is truncated", String::from_utf8_lossy(&typ)))?;
        out.push((typ, payload));
    }
    Ok(out)
}

fn child<'a>(b: &'a [u8], name: &[u8; 4]) -> R<Option<&'a [u8]>> {
    Ok(boxes(b)?.into_iter().find(|(t, _)| t == name).map(|(_, p)| p))
}

fn need<'a>(b: &'a [u8], name: &[u8; 4], parent: &str) -> R<&'a [u8]> {
    child(b, name)?.ok_or_else(|| format!("missing `{}` box in `{parent}`", String::from_utf8_lossy(name)))
}

const MAX_MOOV: u64 = 512 << 20;

/// Locate and read the `moov` box of a file (top-level scan, no mdat read).
fn read_moov(f: &mut File) -> R<Vec<u8>> {
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut pos = 0u64;
    let mut saw_moof = false;
    while pos + 8 <= len {
        f.seek(SeekFrom::Start(pos)).map_err(|e| e.to_string())?;
        let mut h = [0u8; 16];
        f.read_exact(&mut h[..8]).map_err(|e| e.to_string())?;
        let mut size = u32::from_be_bytes(h[..4].try_into().unwrap()) as u64;
        let typ: [u8; 4] = h[4..8].try_into().unwrap();
        let mut hdr = 8u64;
        if size == 1 {
            f.read_exact(&mut h[8..16]).map_err(|_| "truncated box header".to_string())?;
            size = u64::from_be_bytes(h[8..16].try_into().unwrap());
            hdr = 16;
        } else if size == 0 {
            size = len - pos;
        }
        if size < hdr {
            return Err(format!("top-level box at offset {pos} has invalid size {size}"));
        }
        if &typ == b"moof" {
            saw_moof = true;
        }
        if &typ == b"moov" {
            let body = size - hdr;
            if pos + size > len {
                return Err(format!("`moov` box claims {size} bytes but the file ends at {len} (truncated?)"));
            }
            if body > MAX_MOOV {
                return Err(format!("`moov` box too large ({body} bytes)"));
            }
            let mut buf = vec![0u8; body as usize];
            f.read_exact(&mut buf).map_err(|e| format!("reading moov: {e}"))?;
            return Ok(buf);
        }
        pos = pos.checked_add(size).ok_or("box size overflow")?;
    }
    if saw_moof {
        Err("fragmented mp4 (moof) is not supported".into())
    } else {
        Err("no `moov` box found (not an mp4, or truncated)".into())
    }
}

fn full_box(c: &mut Cur) -> R<u8> {
    let v = c.u8()?;
    c.take(3)?;
    Ok(v)
}

fn parse_trak(trak: &[u8], movie_timescale: u32, file_len: u64) -> R<Option<Av1Track>> {
    let mdia = need(trak, b"mdia", "trak")?;
    let Some(hdlr) = child(mdia, b"hdlr")? else { return Ok(None) };
    let mut c = Cur::new(hdlr);
    full_box(&mut c)?;
    c.take(4)?;
    if c.take(4)? != b"vide" {
        return Ok(None);
    }
    let minf = need(mdia, b"minf", "mdia")?;
    let stbl = need(minf, b"stbl", "minf")?;
    let (width, height, config_obus) = av1_sample_entry(stbl)?;
    let timescale = media_timescale(mdia)?;
    let sizes = sample_sizes(stbl, file_len)?;
    let nsamp = sizes.len();
    let dts = decode_times(stbl, nsamp)?;
    let cts = composition_offsets(stbl, nsamp)?;
    let sync = sync_samples(stbl, nsamp)?;
    let offsets = sample_offsets(stbl, &sizes)?;
    let (shift_ticks, delay_s) = edit_list_start(trak, movie_timescale)?;
    let samples = (0..nsamp)
        .map(|i| Mp4Sample {
            offset: offsets[i],
            size: sizes[i],
            pts: (dts[i] + cts[i] - shift_ticks) as f64 / timescale as f64 + delay_s,
            sync: sync[i],
        })
        .collect();
    Ok(Some(Av1Track { width, height, timescale, config_obus, samples }))
}

/// `stsd`'s `av01` entry: width, height and the `av1C` configuration OBUs.
fn av1_sample_entry(stbl: &[u8]) -> R<(u32, u32, Vec<u8>)> {
    let stsd = need(stbl, b"stsd", "stbl")?;
    let mut c = Cur::new(stsd);
    full_box(&mut c)?;
    let n = c.u32()?;
    if n == 0 {
        return Err("empty `stsd`".into());
    }
    let entries = boxes(&stsd[8..])?;
    let Some((_, av01)) = entries.iter().find(|(t, _)| t == b"av01") else {
        let names: Vec<String> = entries.iter().map(|(t, _)| String::from_utf8_lossy(t).into_owned()).collect();
        return Err(format!("video track codec {names:?} is not AV1 (av01)"));
    };
    let mut c = Cur::new(av01);
    c.take(24)?; // reserved(6) + data_ref(2) + pre_defined/reserved(16)
    let width = c.u16()? as u32;
    let height = c.u16()? as u32;
    c.take(50)?; // resolutions, reserved, frame_count, compressorname, depth, pre_defined
    let mut config_obus = Vec::new();
    if let Some(av1c) = child(&av01[78..], b"av1C")? {
        if av1c.len() < 4 {
            return Err("`av1C` box too short".into());
        }
        config_obus = av1c[4..].to_vec();
    }
    Ok((width, height, config_obus))
}

/// `mdhd`'s timescale (ticks per second of the track's times).
fn media_timescale(mdia: &[u8]) -> R<u32> {
    let mdhd = need(mdia, b"mdhd", "mdia")?;
    let mut c = Cur::new(mdhd);
    let v = full_box(&mut c)?;
    let timescale = if v == 1 {
        c.take(16)?;
        c.u32()?
    } else {
        c.take(8)?;
        c.u32()?
    };
    if timescale == 0 {
        return Err("`mdhd` timescale is 0".into());
    }
    Ok(timescale)
}

/// Sample sizes from `stsz`.
fn sample_sizes(stbl: &[u8], file_len: u64) -> R<Vec<u32>> {
    let sizes: Vec<u32> = if let Some(stsz) = child(stbl, b"stsz")? {
        let mut c = Cur::new(stsz);
        full_box(&mut c)?;
        let fixed = c.u32()?;
        if fixed != 0 {
            let n = c.u32()? as usize;
            if n as u64 > file_len {
                return Err(format!("implausible sample count {n}"));
            }
            vec![fixed; n]
        } else {
            let n = c.count(4)?;
            (0..n).map(|_| c.u32()).collect::<R<_>>()?
        }
    } else {
        return Err("missing `stsz` box (compact `stz2` is not supported)".into());
    };
    Ok(sizes)
}

/// Decode times of `nsamp` samples from `stts`.
fn decode_times(stbl: &[u8], nsamp: usize) -> R<Vec<i64>> {
    let stts = need(stbl, b"stts", "stbl")?;
    let mut c = Cur::new(stts);
    full_box(&mut c)?;
    let ne = c.count(8)?;
    let mut dts = Vec::with_capacity(nsamp);
    let mut t: i64 = 0;
    for _ in 0..ne {
        let cnt = c.u32()? as usize;
        let delta = c.u32()? as i64;
        for _ in 0..cnt.min(nsamp - dts.len()) {
            dts.push(t);
            t = t.checked_add(delta).ok_or("stts overflow")?;
        }
    }
    if dts.len() != nsamp {
        return Err(format!("`stts` covers {} samples but `stsz` has {nsamp}", dts.len()));
    }
    Ok(dts)
}

/// Composition offsets from `ctts` (absent: all 0).
fn composition_offsets(stbl: &[u8], nsamp: usize) -> R<Vec<i64>> {
    let mut cts = vec![0i64; nsamp];
    if let Some(ctts) = child(stbl, b"ctts")? {
        let mut c = Cur::new(ctts);
        let v = full_box(&mut c)?;
        let ne = c.count(8)?;
        let mut i = 0usize;
        for _ in 0..ne {
            let cnt = c.u32()? as usize;
            let raw = c.u32()?;
            let off = if v == 0 { raw as i64 } else { raw as i32 as i64 };
            for _ in 0..cnt.min(nsamp - i) {
                cts[i] = off;
                i += 1;
            }
        }
    }
    Ok(cts)
}

/// Sync (key) samples from `stss` (absent: all sync).
fn sync_samples(stbl: &[u8], nsamp: usize) -> R<Vec<bool>> {
    let mut sync = vec![true; nsamp];
    if let Some(stss) = child(stbl, b"stss")? {
        sync.iter_mut().for_each(|s| *s = false);
        let mut c = Cur::new(stss);
        full_box(&mut c)?;
        let ne = c.count(4)?;
        for _ in 0..ne {
            let k = c.u32()? as usize;
            if k == 0 || k > nsamp {
                return Err(format!("`stss` references sample {k} of {nsamp}"));
            }
            sync[k - 1] = true;
        }
    }
    Ok(sync)
}

/// File offset of each sample, from the chunk offsets (`stco`/`co64`) and `stsc`.
fn sample_offsets(stbl: &[u8], sizes: &[u32]) -> R<Vec<u64>> {
    let nsamp = sizes.len();
    let chunk_offsets: Vec<u64> = if let Some(stco) = child(stbl, b"stco")? {
        let mut c = Cur::new(stco);
        full_box(&mut c)?;
        let n = c.count(4)?;
        (0..n).map(|_| c.u32().map(|x| x as u64)).collect::<R<_>>()?
    } else if let Some(co64) = child(stbl, b"co64")? {
        let mut c = Cur::new(co64);
        full_box(&mut c)?;
        let n = c.count(8)?;
        (0..n).map(|_| c.u64()).collect::<R<_>>()?
    } else {
        return Err("missing `stco`/`co64` box".into());
    };
    let stsc = need(stbl, b"stsc", "stbl")?;
    let mut c = Cur::new(stsc);
    full_box(&mut c)?;
    let ne = c.count(12)?;
    let mut stsc_e = Vec::with_capacity(ne);
    for _ in 0..ne {
        let first = c.u32()? as usize;
        let per = c.u32()? as usize;
        c.u32()?;
        if first == 0 || stsc_e.last().is_some_and(|&(f, _)| first <= f) {
            return Err("`stsc` entries are not increasing".into());
        }
        stsc_e.push((first, per));
    }
    let mut offsets = Vec::with_capacity(nsamp);
    'outer: for (ci, &base) in chunk_offsets.iter().enumerate() {
        let chunk = ci + 1;
        let per = stsc_e.iter().rev().find(|(f, _)| *f <= chunk).map(|&(_, p)| p).unwrap_or(0);
        let mut off = base;
        for _ in 0..per {
            if offsets.len() >= nsamp {
                break 'outer;
            }
            offsets.push(off);
            off = off.checked_add(sizes[offsets.len() - 1] as u64).ok_or("offset overflow")?;
        }
    }
    if offsets.len() != nsamp {
        return Err(format!("chunk tables locate {} samples but `stsz` has {nsamp}", offsets.len()));
    }
    Ok(offsets)
}

/// The edit list's start: leading empty edits delay the track (seconds), the first media
/// edit's media_time is subtracted (ticks).
fn edit_list_start(trak: &[u8], movie_timescale: u32) -> R<(i64, f64)> {
    let mut shift_ticks: i64 = 0;
    let mut delay_s = 0.0f64;
    if let Some(edts) = child(trak, b"edts")?
        && let Some(elst) = child(edts, b"elst")? {
            let mut c = Cur::new(elst);
            let v = full_box(&mut c)?;
            let ne = c.count(if v == 1 { 20 } else { 12 })?;
            for _ in 0..ne {
                let (dur, mt) = if v == 1 { (c.u64()?, c.u64()? as i64) } else { (c.u32()? as u64, c.u32()? as i32 as i64) };
                c.u32()?;
                if mt == -1 {
                    if movie_timescale > 0 {
                        delay_s += dur as f64 / movie_timescale as f64;
                    }
                } else {
                    shift_ticks = mt;
                    break;
                }
            }
        }
    Ok((shift_ticks, delay_s))
}

/// Parse the mp4 file's first AV1 video track.
pub fn parse_av1_track(f: &mut File) -> R<Av1Track> {
    let file_len = f.metadata().map_err(|e| e.to_string())?.len();
    let moov = read_moov(f)?;
    let mut movie_timescale = 0u32;
    if let Some(mvhd) = child(&moov, b"mvhd")? {
        let mut c = Cur::new(mvhd);
        let v = full_box(&mut c)?;
        c.take(if v == 1 { 16 } else { 8 })?;
        movie_timescale = c.u32()?;
    }
    for (t, trak) in boxes(&moov)? {
        if &t == b"trak"
            && let Some(track) = parse_trak(trak, movie_timescale, file_len)? {
                if track.samples.is_empty() {
                    return Err("video track has no samples".into());
                }
                return Ok(track);
            }
    }
    Err("no video track found".into())
}

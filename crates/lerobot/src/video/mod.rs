//! mp4/AV1 video reading: demux (own parser), decode (rav1d), convert to RGB.

pub mod color;
pub mod mp4;
#[cfg(feature = "video")]
mod av1;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use color::RgbImage;
pub use mp4::{Av1Track, Mp4Sample};

use crate::error::DatasetError;

/// How many decoded frames a reader keeps.
const FRAME_CACHE: usize = 8;

/// Random access to the frames of one AV1 mp4 file.
pub struct VideoReader {
    path: PathBuf,
    file: File,
    track: Av1Track,
    #[cfg(feature = "video")]
    decoder: Option<av1::Av1Decoder>,
    /// Next sample the decoder expects (decoding can continue from here without seeking).
    next_sample: usize,
    cache: VecDeque<(usize, Arc<RgbImage>)>,
}

impl std::fmt::Debug for VideoReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VideoReader")
            .field("path", &self.path)
            .field("width", &self.track.width)
            .field("height", &self.track.height)
            .field("frames", &self.track.samples.len())
            .finish()
    }
}

impl VideoReader {
    /// Open an mp4 file and index its AV1 track (no decoding yet).
    pub fn open(path: &Path) -> Result<Self, DatasetError> {
        let mut file = File::open(path).map_err(|e| DatasetError::io(path, e))?;
        let track = crate::error::guard(path, "mp4 parsing", DatasetError::video, || {
            mp4::parse_av1_track(&mut file).map_err(|m| DatasetError::video(path, m))
        })?;
        let len = file.metadata().map_err(|e| DatasetError::io(path, e))?.len();
        if let Some((i, s)) =
            track.samples.iter().enumerate().find(|(_, s)| s.offset.saturating_add(s.size as u64) > len)
        {
            return Err(DatasetError::video(
                path,
                format!("sample {i} lies beyond the end of the file ({} + {} > {len}; truncated?)", s.offset, s.size),
            ));
        }
        if track.samples.iter().any(|s| !s.pts.is_finite()) {
            return Err(DatasetError::video(path, "non-finite sample timestamps"));
        }
        Ok(VideoReader {
            path: path.to_path_buf(),
            file,
            track,
            #[cfg(feature = "video")]
            decoder: None,
            next_sample: usize::MAX,
            cache: VecDeque::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn track(&self) -> &Av1Track {
        &self.track
    }
    pub fn num_frames(&self) -> usize {
        self.track.samples.len()
    }
    /// Presentation timestamps (seconds) of all frames.
    pub fn timestamps(&self) -> Vec<f64> {
        self.track.samples.iter().map(|s| s.pts).collect()
    }

    /// Index of the frame whose timestamp is closest to `ts`; error if farther than `tolerance_s`
    /// (lerobot's check: `min distance < tolerance_s`).
    pub fn frame_index_at(&self, ts: f64, tolerance_s: f64) -> Result<usize, DatasetError> {
        let s = &self.track.samples;
        // Samples are in presentation order for AV1; fall back to a linear scan otherwise.
        let sorted = s.windows(2).all(|w| w[0].pts <= w[1].pts);
        let best = if sorted {
            let i = s.partition_point(|x| x.pts < ts);
            [i.saturating_sub(1), i.min(s.len() - 1)]
                .into_iter()
                .min_by(|&a, &b| (s[a].pts - ts).abs().total_cmp(&(s[b].pts - ts).abs()))
                .unwrap_or(0)
        } else {
            (0..s.len()).min_by(|&a, &b| (s[a].pts - ts).abs().total_cmp(&(s[b].pts - ts).abs())).unwrap_or(0)
        };
        let d = (s[best].pts - ts).abs();
        if !(d < tolerance_s) {
            return Err(DatasetError::TimestampNotFound {
                path: self.path.clone(),
                timestamp: ts,
                closest: s[best].pts,
                tolerance_s,
            });
        }
        Ok(best)
    }

    /// Decode the frame closest to `ts` (within `tolerance_s`).
    pub fn frame_at(&mut self, ts: f64, tolerance_s: f64) -> Result<Arc<RgbImage>, DatasetError> {
        let i = self.frame_index_at(ts, tolerance_s)?;
        self.frame(i)
    }

    /// Decode several timestamps at once (decoded in ascending order to reuse decoder state).
    pub fn frames_at(&mut self, ts: &[f64], tolerance_s: f64) -> Result<Vec<Arc<RgbImage>>, DatasetError> {
        let idx: Vec<usize> = ts.iter().map(|&t| self.frame_index_at(t, tolerance_s)).collect::<Result<_, _>>()?;
        let mut order: Vec<usize> = (0..idx.len()).collect();
        order.sort_by_key(|&k| idx[k]);
        let mut out: Vec<Option<Arc<RgbImage>>> = vec![None; idx.len()];
        for k in order {
            out[k] = Some(self.frame(idx[k])?);
        }
        Ok(out.into_iter().map(|x| x.expect("filled")).collect())
    }

    #[cfg_attr(not(feature = "video"), allow(dead_code))]
    fn read_sample(&mut self, i: usize) -> Result<Vec<u8>, DatasetError> {
        let s = self.track.samples[i];
        let mut buf = vec![0u8; s.size as usize];
        self.file
            .seek(SeekFrom::Start(s.offset))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(|e| DatasetError::video(&self.path, format!("reading sample {i} at offset {}: {e}", s.offset)))?;
        Ok(buf)
    }

    /// Decode frame number `i` (decode order).
    pub fn frame(&mut self, i: usize) -> Result<Arc<RgbImage>, DatasetError> {
        if i >= self.track.samples.len() {
            return Err(DatasetError::arg(format!(
                "{}: frame {i} out of range ({} frames)",
                self.path.display(),
                self.track.samples.len()
            )));
        }
        if let Some((_, f)) = self.cache.iter().find(|(k, _)| *k == i) {
            return Ok(f.clone());
        }
        let path = self.path.clone();
        let r = crate::error::guard(&path, "AV1 decoding", DatasetError::video, || self.decode_to(i));
        if r.is_err() {
            // The decoder may be in any state after an error: start afresh next time.
            #[cfg(feature = "video")]
            {
                self.decoder = None;
            }
            self.next_sample = usize::MAX;
        }
        let img = Arc::new(r?);
        if self.cache.len() >= FRAME_CACHE {
            self.cache.pop_front();
        }
        self.cache.push_back((i, img.clone()));
        Ok(img)
    }

    #[cfg(not(feature = "video"))]
    fn decode_to(&mut self, _i: usize) -> Result<RgbImage, DatasetError> {
        Err(DatasetError::unsupported(&self.path, "built without the `video` feature (AV1 decoding)"))
    }

    #[cfg(feature = "video")]
    fn decode_to(&mut self, target: usize) -> Result<RgbImage, DatasetError> {
        let key = (0..=target).rev().find(|&k| self.track.samples[k].sync).unwrap_or(0);
        let resume = self.decoder.is_some() && self.next_sample >= key && self.next_sample <= target;
        if !resume {
            match &mut self.decoder {
                Some(d) => d.flush(),
                None => self.decoder = Some(av1::Av1Decoder::new().map_err(|m| DatasetError::video(&self.path, m))?),
            }
            self.next_sample = key;
        }
        let mut found = None;
        while self.next_sample <= target {
            let i = self.next_sample;
            let mut data = self.read_sample(i)?;
            if i == key && !resume && !self.track.config_obus.is_empty() {
                let mut d = self.track.config_obus.clone();
                d.extend_from_slice(&data);
                data = d;
            }
            let dec = self.decoder.as_mut().expect("decoder");
            let pics =
                dec.decode(&data, i as i64).map_err(|m| DatasetError::video(&self.path, format!("sample {i}: {m}")))?;
            self.next_sample = i + 1;
            found = pics.into_iter().find(|(ts, _)| *ts == target as i64).map(|(_, p)| p).or(found);
        }
        if found.is_none() {
            let dec = self.decoder.as_mut().expect("decoder");
            let pics = dec.drain().map_err(|m| DatasetError::video(&self.path, m))?;
            found = pics.into_iter().find(|(ts, _)| *ts == target as i64).map(|(_, p)| p);
        }
        let yuv = found.ok_or_else(|| DatasetError::video(&self.path, format!("frame {target}: decoder produced no picture")))?;
        Ok(yuv.to_rgb())
    }
}

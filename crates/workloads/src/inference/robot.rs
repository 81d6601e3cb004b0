//! A synthetic robot for the latency bench: cameras that deliver a new uint8 HWC frame on
//! every call (a moving gradient with per-pixel noise, so no frame equals the last and no
//! kernel sees constant input) and state vectors that random-walk.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// One camera frame as a driver hands it over: uint8, `[h, w, 3]` row-major.
#[derive(Clone, Debug)]
pub struct Frame {
    pub height: usize,
    pub width: usize,
    pub rgb: Vec<u8>,
}

/// One observation in robot units, before any preprocessing.
#[derive(Clone, Debug)]
pub struct Observation {
    /// One frame per camera, in the config's camera order.
    pub frames: Vec<Frame>,
    /// `observation.state` (absent when the policy has none).
    pub state: Option<Vec<f32>>,
    /// The ENV input (absent when the policy has none).
    pub env_state: Option<Vec<f32>>,
}

/// Produces a new [`Observation`] per call; a pure function of (seed, call index).
pub struct SyntheticRobot {
    obs: Observation,
    rng: StdRng,
    tick: u64,
}

/// Random-walk step of the state vectors (robot units, the scale of joint radians).
const STATE_STEP: f32 = 0.02;
/// Peak noise amplitude added to the gradient, in uint8 levels.
const NOISE: u32 = 24;

impl SyntheticRobot {
    /// Cameras as `[3, h, w]` (the config's shapes), state and ENV dimensions.
    pub fn new(cameras: &[[usize; 3]], state_dim: Option<usize>, env_dim: Option<usize>, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let frames = cameras.iter().map(|&[_, h, w]| Frame { height: h, width: w, rgb: vec![0; h * w * 3] }).collect();
        let state = state_dim.map(|d| crate::normal_vec(&mut rng, d));
        let env_state = env_dim.map(|d| crate::normal_vec(&mut rng, d));
        Self { obs: Observation { frames, state, env_state }, rng, tick: 0 }
    }

    /// The next observation: every frame redrawn, every state coordinate one step further.
    pub fn observe(&mut self) -> &Observation {
        let tick = self.tick;
        self.tick += 1;
        for (cam, f) in self.obs.frames.iter_mut().enumerate() {
            draw(f, tick, cam as u64);
        }
        for v in [&mut self.obs.state, &mut self.obs.env_state].into_iter().flatten() {
            let steps = crate::normal_vec(&mut self.rng, v.len());
            v.iter_mut().zip(steps).for_each(|(x, s)| *x += STATE_STEP * s);
        }
        &self.obs
    }
}

/// A diagonal gradient that moves 3 levels per call (phase-shifted per channel and camera)
/// plus xorshift noise seeded by (tick, camera).
fn draw(f: &mut Frame, tick: u64, cam: u64) {
    let (h, w) = (f.height.max(1), f.width.max(1));
    let mut s = (tick.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ cam.wrapping_mul(0xD1B5_4A32_D192_ED03)) | 1;
    let shift = (tick * 3 + cam * 50) as usize;
    for (i, px) in f.rgb.chunks_exact_mut(3).enumerate() {
        let (y, x) = (i / w, i % w);
        let base = (x * 255 / w + y * 255 / h) / 2 + shift;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        for (c, v) in px.iter_mut().enumerate() {
            let noise = ((s >> (c * 8)) as u32 % (2 * NOISE + 1)) as usize;
            *v = ((base + c * 85 + noise) % 256) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_change_every_call_and_state_walks() {
        let mut r = SyntheticRobot::new(&[[3, 6, 8]], Some(4), None, 7);
        let a = r.observe().clone();
        let b = r.observe().clone();
        assert_eq!(a.frames[0].rgb.len(), 6 * 8 * 3);
        assert_ne!(a.frames[0].rgb, b.frames[0].rgb);
        assert!(a.frames[0].rgb.iter().any(|&v| v != a.frames[0].rgb[0]), "not a constant frame");
        assert_ne!(a.state, b.state);
        assert!(b.env_state.is_none());
        // Reproducible from the seed.
        let mut again = SyntheticRobot::new(&[[3, 6, 8]], Some(4), None, 7);
        assert_eq!(again.observe().frames[0].rgb, a.frames[0].rgb);
    }
}

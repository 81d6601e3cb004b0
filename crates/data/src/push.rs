//! A small 2D manipulation simulator: push a block onto a target square (a PushT-like task
//! without rotation), with a scripted expert, rendered to RGB frames.
//!
//! Conventions follow lerobot's PushT: a 512 × 512 workspace in pixels, the agent is a disk
//! whose position is the state, the action is the agent's target position (a PD-like
//! controller moves the agent toward it at bounded speed), 10 fps. The block is an axis-aligned
//! square pushed by the agent (the agent never overlaps it: the block is moved out along the
//! axis of least penetration). Reward is the fraction of the target covered by the block.

use rand::{Rng, SeedableRng};
use vramlab_lerobot::writer::{DatasetSpec, EpisodeData};

pub const WORLD: f32 = 512.0;
pub const AGENT_RADIUS: f32 = 15.0;
pub const BLOCK_HALF: f32 = 40.0;
/// The agent moves at most this far per step (pixels).
pub const MAX_SPEED: f32 = 24.0;
pub const TARGET: [f32; 2] = [256.0, 256.0];
pub const TASK: &str = "Push the grey block onto the green square.";

/// Simulator state.
#[derive(Clone, Debug, PartialEq)]
pub struct PushEnv {
    pub agent: [f32; 2],
    pub block: [f32; 2],
}

fn clamp_world(p: [f32; 2], margin: f32) -> [f32; 2] {
    [p[0].clamp(margin, WORLD - margin), p[1].clamp(margin, WORLD - margin)]
}

impl PushEnv {
    /// A random start: agent and block apart, block away from the target.
    pub fn reset(rng: &mut impl Rng) -> Self {
        loop {
            let agent = [rng.random_range(40.0..472.0), rng.random_range(40.0..472.0)];
            let block = [rng.random_range(100.0..412.0), rng.random_range(100.0..412.0)];
            let d_target = ((block[0] - TARGET[0]).powi(2) + (block[1] - TARGET[1]).powi(2)).sqrt();
            let d_agent = ((block[0] - agent[0]).powi(2) + (block[1] - agent[1]).powi(2)).sqrt();
            if d_target > 90.0 && d_agent > BLOCK_HALF * 1.5 + AGENT_RADIUS {
                return Self { agent, block };
            }
        }
    }

    /// Fraction of the target square covered by the block.
    pub fn coverage(&self) -> f32 {
        let ov = |a: f32, b: f32| (2.0 * BLOCK_HALF - (a - b).abs()).max(0.0);
        ov(self.block[0], TARGET[0]) * ov(self.block[1], TARGET[1]) / (4.0 * BLOCK_HALF * BLOCK_HALF)
    }

    pub fn success(&self) -> bool {
        self.coverage() > 0.95
    }

    /// Move the agent toward `action` (bounded speed, in sub-steps) and push the block.
    pub fn step(&mut self, action: [f32; 2]) {
        let target = clamp_world(action, AGENT_RADIUS);
        let sub = 4;
        for _ in 0..sub {
            let d = [target[0] - self.agent[0], target[1] - self.agent[1]];
            let n = (d[0] * d[0] + d[1] * d[1]).sqrt();
            let s = (MAX_SPEED / sub as f32).min(n);
            if n > 1e-6 {
                self.agent = [self.agent[0] + d[0] / n * s, self.agent[1] + d[1] / n * s];
            }
            // Disk–square contact: push the block out along the axis of least penetration.
            let rel = [self.agent[0] - self.block[0], self.agent[1] - self.block[1]];
            let closest = [rel[0].clamp(-BLOCK_HALF, BLOCK_HALF), rel[1].clamp(-BLOCK_HALF, BLOCK_HALF)];
            let gap = [rel[0] - closest[0], rel[1] - closest[1]];
            let dist = (gap[0] * gap[0] + gap[1] * gap[1]).sqrt();
            if dist < AGENT_RADIUS {
                let pen_x = BLOCK_HALF + AGENT_RADIUS - rel[0].abs();
                let pen_y = BLOCK_HALF + AGENT_RADIUS - rel[1].abs();
                if pen_x < pen_y {
                    self.block[0] -= rel[0].signum() * pen_x;
                } else {
                    self.block[1] -= rel[1].signum() * pen_y;
                }
                self.block = clamp_world(self.block, BLOCK_HALF);
            }
        }
    }

    /// Render to `size × size` RGB8 (2×2 supersampled).
    pub fn render(&self, size: usize) -> Vec<u8> {
        let mut img = vec![0u8; size * size * 3];
        let scale = WORLD / size as f32;
        for y in 0..size {
            for x in 0..size {
                let mut acc = [0f32; 3];
                for sy in 0..2 {
                    for sx in 0..2 {
                        let px = (x as f32 + 0.25 + 0.5 * sx as f32) * scale;
                        let py = (y as f32 + 0.25 + 0.5 * sy as f32) * scale;
                        let c = self.color_at(px, py);
                        for k in 0..3 {
                            acc[k] += c[k];
                        }
                    }
                }
                for k in 0..3 {
                    img[(y * size + x) * 3 + k] = (acc[k] / 4.0).round().clamp(0.0, 255.0) as u8;
                }
            }
        }
        img
    }

    fn color_at(&self, x: f32, y: f32) -> [f32; 3] {
        let in_sq = |c: [f32; 2], h: f32| (x - c[0]).abs() <= h && (y - c[1]).abs() <= h;
        if (x - self.agent[0]).powi(2) + (y - self.agent[1]).powi(2) <= AGENT_RADIUS * AGENT_RADIUS {
            return [65.0, 105.0, 225.0];
        }
        if in_sq(self.block, BLOCK_HALF) {
            return [119.0, 136.0, 153.0];
        }
        if in_sq(TARGET, BLOCK_HALF) {
            return [144.0, 238.0, 144.0];
        }
        [245.0, 245.0, 245.0]
    }
}

/// The scripted expert: go behind the block (seen from the target, around it if needed), then
/// push along the dominant axis toward the target.
pub fn expert_action(env: &PushEnv) -> [f32; 2] {
    let d = [TARGET[0] - env.block[0], TARGET[1] - env.block[1]];
    // Push along the axis with the larger remaining error (the block moves axis by axis).
    let axis = if d[0].abs() >= d[1].abs() { 0 } else { 1 };
    let dir = d[axis].signum();
    let standoff = BLOCK_HALF + AGENT_RADIUS + 2.0;
    let mut behind = env.block;
    behind[axis] -= dir * standoff;
    let rel = [env.agent[0] - behind[0], env.agent[1] - behind[1]];
    let at_push_point = rel[axis].abs() < 6.0 && rel[1 - axis].abs() < 10.0;
    if at_push_point {
        let mut a = env.agent;
        a[axis] += dir * d[axis].abs().min(MAX_SPEED);
        a[1 - axis] = env.block[1 - axis];
        return a;
    }
    // On the wrong side of the block: detour around it along the other axis first.
    let ahead = (env.agent[axis] - env.block[axis]) * dir > -BLOCK_HALF;
    let overlapping_lane = (env.agent[1 - axis] - env.block[1 - axis]).abs() < BLOCK_HALF + AGENT_RADIUS + 4.0;
    if ahead && overlapping_lane {
        let side = if env.agent[1 - axis] >= env.block[1 - axis] { 1.0 } else { -1.0 };
        let mut a = env.agent;
        a[1 - axis] = env.block[1 - axis] + side * (BLOCK_HALF + AGENT_RADIUS + 10.0);
        if (a[1 - axis] - env.agent[1 - axis]).abs() < 4.0 {
            a[axis] = behind[axis];
        }
        return clamp_world(a, AGENT_RADIUS);
    }
    if ahead {
        let mut a = behind;
        a[1 - axis] = env.agent[1 - axis];
        return clamp_world(a, AGENT_RADIUS);
    }
    clamp_world(behind, AGENT_RADIUS)
}

/// Record one expert episode (at most `max_steps` frames; ends a few frames after success).
pub fn record_episode(seed: u64, max_steps: usize, image_size: usize) -> EpisodeData {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut env = PushEnv::reset(&mut rng);
    let mut ep = EpisodeData {
        task: TASK.into(),
        state: Vec::new(),
        action: Vec::new(),
        reward: Vec::new(),
        done: Vec::new(),
        success: Vec::new(),
        frames: Vec::new(),
    };
    let mut after_success = 0;
    for t in 0..max_steps {
        let mut a = expert_action(&env);
        // A little action noise, as human demonstrations have.
        a[0] += rng.random_range(-2.0..2.0);
        a[1] += rng.random_range(-2.0..2.0);
        ep.frames.push(env.render(image_size));
        ep.state.extend(env.agent);
        ep.action.extend(a);
        env.step(a);
        let ok = env.success();
        ep.reward.push(env.coverage());
        ep.success.push(ok);
        if ok {
            after_success += 1;
        }
        let last = after_success >= 5 || t + 1 == max_steps;
        ep.done.push(last);
        if last {
            break;
        }
    }
    ep
}

/// The dataset layout of [`record_episode`]'s episodes.
pub fn dataset_spec(image_size: usize) -> DatasetSpec {
    DatasetSpec {
        fps: 10.0,
        robot_type: "vramlab_push".into(),
        state_dim: 2,
        action_dim: 2,
        state_names: vec!["x".into(), "y".into()],
        action_names: vec!["x".into(), "y".into()],
        camera_key: "observation.image".into(),
        height: image_size,
        width: image_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_solves_most_episodes() {
        let mut solved = 0;
        for s in 0..20 {
            let ep = record_episode(s, 300, 32);
            if ep.success.iter().any(|&x| x) {
                solved += 1;
            }
            assert_eq!(ep.frames.len(), ep.reward.len());
            assert_eq!(ep.state.len(), 2 * ep.frames.len());
        }
        assert!(solved >= 18, "expert solved {solved}/20");
    }

    #[test]
    fn pushing_moves_the_block_and_render_shows_it() {
        let mut env = PushEnv { agent: [100.0, 256.0], block: [180.0, 256.0] };
        for _ in 0..10 {
            env.step([300.0, 256.0]);
        }
        assert!(env.block[0] > 200.0, "block pushed: {:?}", env.block);
        let img = env.render(64);
        let px = |x: f32, y: f32| {
            let (i, j) = ((y / 8.0) as usize, (x / 8.0) as usize);
            img[(i * 64 + j) * 3..(i * 64 + j) * 3 + 3].to_vec()
        };
        assert_eq!(px(env.block[0], env.block[1] - 30.0), vec![119, 136, 153]);
        assert_eq!(px(env.agent[0], env.agent[1]), vec![65, 105, 225]);
    }
}

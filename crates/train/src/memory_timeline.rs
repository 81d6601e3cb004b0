//! `--memory_timeline`: every allocation and free of chosen steps, as a PyTorch memory snapshot.
//!
//! For a step listed in [`crate::TrainConfig::memory_timeline`], the trainer records the CPU
//! heap's events ([`vramlab_probe::timeline`]) from the start of the step (data) to the end of
//! its optimizer update, labelled with the phase that made them: `data`, `forward/<stage>`
//! (the model's stage plan, [`vramlab_stages::Staged`]), `backward` (`backward/<stage>` for
//! block checkpointing's recomputation), `optimizer`, and `step` for the bookkeeping between
//! them. It writes `memory_timeline/step_<N>.pickle`, the layout of
//! `torch.cuda.memory._dump_snapshot()` ([`vramlab_probe::memory_viz`]), which
//! <https://pytorch.org/memory_viz> opens. Only the counting allocator's heap (the flex
//! backend) has events to record; with another probe the option is reported and ignored.

use std::fmt::Debug;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use vramlab_probe::scope::{self, ScopeGuard};
use vramlab_probe::{CountingAllocator, MemoryProbe, PeakKind, memory_viz, timeline};
use vramlab_stages::Staged;

use crate::metrics::StepRecord;
use crate::model::{LossParts, TrainModel};
use crate::error::TrainError;

/// Events kept per recorded step: 4 Mi × 32 bytes, taken from the system allocator (virtual
/// memory: only the pages written become resident) and not counted in the live bytes.
pub const CAPACITY: usize = 1 << 22;

/// Directory of the snapshots inside the run's output directory.
pub const DIR: &str = "memory_timeline";

/// `label` as the current scope while a step is being recorded (nothing otherwise).
pub(crate) fn scope(label: &str) -> Option<ScopeGuard> {
    timeline::is_recording().then(|| scope::enter(label))
}

/// `<phase>/<stage>` as the current scope while a step is being recorded.
pub(crate) fn stage_scope(phase: &str, stage: &impl Debug) -> Option<ScopeGuard> {
    timeline::is_recording().then(|| scope::enter(&format!("{phase}/{stage:?}")))
}

/// [`TrainModel::forward_loss`], with one scope per stage while a step is being recorded: the
/// same fold over the same stages (`forward_loss` is not meant to be overridden).
pub(crate) fn forward_loss<B, M>(model: &M, batch: &M::Batch) -> LossParts<B>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
{
    if !timeline::is_recording() {
        return model.forward_loss(batch);
    }
    let staged = model.model();
    let input = {
        let _s = scope("forward/input");
        model.input(batch)
    };
    let mut state = {
        let _s = scope("forward/enter");
        staged.enter(&input)
    };
    for s in staged.plan(&input) {
        let _s = stage_scope("forward", &s);
        state = staged.stage(s, state, &input);
    }
    let _s = scope("forward/exit+loss");
    model.loss(staged.exit(state, &input), batch)
}

/// A step being recorded; dropping it unfinished (the step failed) stops the recording.
pub(crate) struct Window {
    step: u64,
    _scope: Option<ScopeGuard>,
}

impl Window {
    /// Start recording `step` if it is listed in `steps` and `probe` counts every allocation.
    pub fn start(steps: &[u64], step: u64, probe: &dyn MemoryProbe) -> Option<Window> {
        if !steps.contains(&step) {
            return None;
        }
        if probe.peak_kind() != PeakKind::Exact || !CountingAllocator::is_installed() {
            eprintln!("warning: --memory_timeline: step {step} not recorded: only the CPU heap (flex backend) has allocation events, the probe here is {}", probe.name());
            return None;
        }
        if let Err(e) = timeline::start(CAPACITY) {
            eprintln!("warning: --memory_timeline: step {step} not recorded: {e}");
            return None;
        }
        Some(Window { step, _scope: Some(scope::enter("step")) })
    }

    /// Stop recording and write `memory_timeline/step_<N>.pickle` under `output_dir`.
    pub fn finish(self, output_dir: &Path, min_block_bytes: u64, record: &StepRecord) -> Result<TimelineFile, TrainError> {
        let rec = timeline::stop().ok_or_else(|| TrainError::State { path: output_dir.join(DIR), msg: "the allocation timeline stopped before the step ended".into() })?;
        let rel = PathBuf::from(DIR).join(format!("step_{}.pickle", self.step));
        let path = output_dir.join(&rel);
        let title = format!("vramlab {}: step {}", output_dir.display(), self.step);
        let opts = memory_viz::SnapshotOptions { min_block_bytes };
        memory_viz::write_snapshot(&rec, &title, &opts, &path).map_err(|source| TrainError::Io { path: path.clone(), source })?;
        if rec.dropped > 0 {
            eprintln!("warning: --memory_timeline: step {}: {} events past the buffer's {CAPACITY} were not kept", self.step, rec.dropped);
        }
        let attribution = vramlab_probe::attribution::attribute(&rec).markdown(self.step);
        Ok(TimelineFile {
            attribution,
            step: self.step,
            path: rel,
            events: rec.events.len() as u64,
            written: rec.events.iter().filter(|e| e.size >= min_block_bytes).count() as u64,
            dropped: rec.dropped,
            bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            replayed_peak: rec.peak_live(),
            peak_step_bytes: record.peak_step_bytes,
        })
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Finished windows have stopped already; this only ends a failed step's recording.
        timeline::stop();
    }
}

/// A written snapshot.
#[derive(Clone, Debug)]
pub struct TimelineFile {
    pub step: u64,
    /// Relative to the run's output directory.
    pub path: PathBuf,
    /// Events recorded, and written (those of blocks of at least `memory_timeline_min_bytes`).
    pub events: u64,
    pub written: u64,
    pub dropped: u64,
    /// Size of the pickle.
    pub bytes: u64,
    /// The highest live bytes replayed from the events (from the live bytes at the start).
    pub replayed_peak: u64,
    /// The step's measured peak ([`StepRecord::peak_step_bytes`]).
    pub peak_step_bytes: u64,
    /// The step's memory per phase and stage ([`vramlab_probe::attribution`]), markdown.
    pub attribution: String,
}

/// File of the per-stage attribution of the recorded steps, next to `summary.md`.
pub const ATTRIBUTION_FILE: &str = "memory_attribution.md";

/// Write [`ATTRIBUTION_FILE`] for the recorded steps (nothing when there are none).
pub fn write_attribution(output_dir: &Path, files: &[TimelineFile]) -> std::io::Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let mut s = String::from(
        "# Memory attribution\n\nReplayed from the allocation timeline of each recorded step (exact, counting allocator, the model's \
         account). Scopes: `data` (the batch), `forward/<stage>` (the model's stage plan), `forward/exit+loss`, `backward` \
         (`backward/<stage>` under block recomputation), `optimizer`, `step` (between phases).\n\n\
         - **allocated**: bytes allocated while the scope was current. **rise above entry**: highest live bytes while the scope \
         was current minus live bytes when it was first entered (saved tensors plus transient workspaces such as im2col columns \
         and casts). **net**: live bytes when it was last current minus on entry.\n\
         - **kept at backward**: of the scope's blocks, what was still live when the backward began: what autodiff keeps for \
         the backward (saved inputs, masks, statistics) plus the stage's output. `vramlab estimate` names the tensors behind \
         these bytes, with their shapes, per module (a model of the same ops).\n\n",
    );
    for f in files {
        s.push_str(&f.attribution);
        s.push('\n');
    }
    std::fs::write(output_dir.join(ATTRIBUTION_FILE), s)
}

/// The `summary.md` section listing the snapshots ("" when there are none).
pub fn summary_section(files: &[TimelineFile]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## Memory timeline\n\nEvery heap allocation and free of these steps, labelled `data`, `forward/<stage>`, `backward`, \
         `optimizer` (`step`: between phases), as PyTorch memory snapshots: open them at <https://pytorch.org/memory_viz> \
         (drag the file in), or `python -m torch.cuda._memory_viz trace_plot FILE -o FILE.html`. Per stage: \
         [`memory_attribution.md`](memory_attribution.md).\n\n\
         | step | file | events | written | dropped | size | peak replayed from the events | measured `peak_step_bytes` |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for f in files {
        s.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} MiB | {} | {} |\n",
            f.step,
            f.path.display(),
            f.events,
            f.written,
            f.dropped,
            vramlab_bytes::mib_text(f.bytes),
            f.replayed_peak,
            f.peak_step_bytes
        ));
    }
    s
}

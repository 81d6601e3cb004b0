//! The seed scenarios in `configs/estimate/`: each parses, reproduces its report's arithmetic
//! where the report gave one, and lands in the expected range; plus the sharding arithmetic on
//! a toy model and the error messages.

use std::path::PathBuf;

use vramlab_paper::config::Sharding;
use vramlab_paper::estimate::{estimate, per_gpu};
use vramlab_paper::{PaperConfig, is_paper_config, report};

const GIB: f64 = (1u64 << 30) as f64;

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs/estimate")
        .join(name)
}

fn load(name: &str) -> PaperConfig {
    PaperConfig::from_file(path(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn every_description_parses_and_reports() {
    let mut n = 0;
    for dir in [path(""), path("validation")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&p).unwrap();
                if !is_paper_config(&text) {
                    continue; // another estimator's config
                }
                let cfg = PaperConfig::from_file(&p).unwrap_or_else(|e| panic!("{e}"));
                let md = report(&cfg).markdown();
                assert!(
                    md.contains("**static total**") && md.contains("## Assumptions"),
                    "{}",
                    p.display()
                );
                n += 1;
            }
        }
    }
    assert!(n >= 12, "found {n} descriptions");
}

#[test]
fn the_crate_docs_example_is_the_example_file() {
    let src = include_str!("../src/lib.rs");
    let start = src.find("//! ```toml\n").unwrap() + "//! ```toml\n".len();
    let end = start + src[start..].find("//! ```\n").unwrap();
    let block: String = src[start..end]
        .lines()
        .map(|l| {
            l.strip_prefix("//! ")
                .or(l.strip_prefix("//!"))
                .unwrap_or(l)
                .to_string()
                + "\n"
        })
        .collect();
    let file = std::fs::read_to_string(path("example.toml")).unwrap();
    assert!(
        file.ends_with(&block),
        "configs/estimate/example.toml differs from the crate docs' example"
    );
    PaperConfig::from_toml_str(&block, "crate docs").unwrap();
}

#[test]
fn openvla_oft_reproduces_the_report_and_corrects_it() {
    let cfg = load("openvla_oft_7b_lora.toml");
    let r = report(&cfg);
    // The report's static 23.57 GiB from its own counts: 2·8.39 B + 2·0.853 B + 8·0.853 B.
    let static_claim = &r.claims[0];
    assert!(
        close(static_claim.reproduced, 23.57, 0.01),
        "{}",
        static_claim.reproduced
    );
    // Its "~5.9 GiB per GPU under 4-way FSDP" is that static total ÷ 4.
    let fsdp = &r.claims[1];
    assert!(close(fsdp.reproduced, 5.89, 0.01), "{}", fsdp.reproduced);
    // From the dims: OpenVLA's ~7.54 B base + OFT's FiLM, heads and LoRA.
    assert!(
        (8.2e9..8.3e9).contains(&r.statics.params),
        "{}",
        r.statics.params
    );
    assert!(
        (0.70e9..0.76e9).contains(&r.statics.trainable),
        "{}",
        r.statics.trainable
    );
    // Real FSDP per GPU: the gathered layers and the (unsharded) activations on top: > 1.5×.
    assert!(fsdp.estimate > 1.5 * fsdp.reproduced, "{}", fsdp.estimate);
    // One GPU: static + activations exceed the 4090 even at batch 1.
    assert!(r.total_bytes > 23.52 * GIB);
}

#[test]
fn vggt_llama_variants_grow_and_the_report_leaves_ten_to_eighteen_gb_for_activations() {
    let totals: Vec<_> = ["frozen", "finetune", "e2e"]
        .iter()
        .map(|v| {
            let r = report(&load(&format!("vggt1b_llama2_7b_{v}.toml")));
            let c = &r.claims[0];
            // The report's convention (2 bytes per frozen, 8 per trained parameter) leaves
            // 10–18 GB of each claim for activations.
            let rest = c.claimed - c.reproduced;
            assert!((9.0..19.0).contains(&rest), "{v}: {rest} GB left");
            r.total_bytes
        })
        .collect();
    assert!(totals[0] < totals[1] && totals[1] < totals[2], "{totals:?}");
    // Mixed-precision AdamW fine-tuning of LLaMA-2-7B does not fit one 80 GB card.
    assert!(totals[1] / 1e9 > 100.0, "{}", totals[1] / 1e9);
}

#[test]
fn act_parameter_count_is_lerobots() {
    // lerobot 0.4.4 ACT, state/action 14, chunk 100, one camera: 51,613,582 parameters.
    let r = report(
        &PaperConfig::from_file(path("validation/act_b8_1cam480x640_c100_f32.toml")).unwrap(),
    );
    assert_eq!(r.statics.params, 51_613_582.0);
    // Chunk 30: 70 fewer decoder position-embedding rows of 512.
    let r = report(&load("act_b8_3cam_bf16.toml"));
    assert_eq!(r.statics.params, (51_613_582 - 70 * 512) as f64);
    assert_eq!(
        r.components
            .iter()
            .find(|c| c.name == "encoder")
            .and_then(|c| c.tokens),
        Some(842)
    );
    // Between the report's low estimate and its observation (the estimate leaves out
    // backward's transients and workspaces).
    assert!(
        (3.5 * GIB..6.5 * GIB).contains(&r.total_bytes),
        "{}",
        r.total_bytes / GIB
    );
}

#[test]
fn act_h100_baselines_within_ten_percent() {
    for name in [
        "act_b8_1cam480x640_c100_f32",
        "act_b8_1cam480x640_c100_bf16",
        "act_b48_1cam480x640_c100_f32",
        "act_b48_1cam240x320_c100_f32",
        "act_b48_1cam96x96_c100_f32",
    ] {
        let r = report(&load(&format!("validation/{name}.toml")));
        let c = &r.claims[0];
        let m = c.measured.unwrap();
        assert!(
            (c.estimate / m - 1.0).abs() < 0.10,
            "{name}: estimate {} GiB vs measured {m} GiB",
            c.estimate
        );
    }
}

#[test]
fn vae_standard_fails_where_pytorch_failed() {
    let r = report(&load("vae3d_standard_b8_grid32x128x128.toml"));
    let oom = r.oom.as_ref().expect("does not fit 80 GB");
    // PyTorch 2.11: 53.2 GiB allocated, then asked for 32 GiB more (the softmax output).
    assert!(
        close(oom.live_bytes / GIB, 53.2, 0.5),
        "{}",
        oom.live_bytes / GIB
    );
    assert!(
        close(oom.request_bytes / GIB, 32.0, 1e-9),
        "{}",
        oom.request_bytes / GIB
    );
    assert!(oom.at.contains("softmax"), "{}", oom.at);
    assert_eq!(r.statics.params, 40_847_092.0);
    // The whole forward needs far more than the report's "20+ GB": four 32 GiB attention maps.
    assert!(r.total_bytes > 180.0 * GIB, "{}", r.total_bytes / GIB);
    let twenty = &r.claims[0];
    assert!(
        (20.0..30.0).contains(&twenty.reproduced),
        "{}",
        twenty.reproduced
    );
}

#[test]
fn zero_stages_on_a_toy_model() {
    let cfg = PaperConfig::from_toml_str(
        r#"
        [paper]
        name = "toy"
        gpus = 4
        weights = "bf16"
        grads = "bf16"
        optimizer = "adamw"
        master_weights = true
        activations = "bf16"
        [[paper.component]]
        name = "blocks"
        params = 1e9
        shard_units = 10
        "#,
        "toy",
    )
    .unwrap();
    let e = estimate(&cfg);
    let s = &e.statics;
    // 2 (bf16 weights) + 2 (bf16 grads) + 8 (two f32 Adam states) + 4 (f32 master) = 16 B/param.
    assert_eq!(s.total(), 16e9);
    let total = |strategy| per_gpu(&cfg, s, e.largest_unit, 0.0, strategy, 4).total;
    assert_eq!(total(Sharding::Single), 16e9);
    assert_eq!(total(Sharding::Ddp), 18e9); // + a bucket copy of the bf16 grads
    assert_eq!(total(Sharding::Zero1), 2e9 + 2e9 + 12e9 / 4.0);
    assert_eq!(total(Sharding::Zero2), 2e9 + 14e9 / 4.0);
    // 16/4 B/param + 2 gathered units of 1e8 params (bf16) + one unit's bf16 grads.
    assert_eq!(total(Sharding::Zero3), 4e9 + 2.0 * 1e8 * 2.0 + 1e8 * 2.0);
    assert_eq!(total(Sharding::Naive), 4e9);
}

#[test]
fn errors_name_the_file_and_the_field() {
    let e = PaperConfig::from_toml_str("[paper]\nname = \"x\"\nweights = \"bf16\"\noptimizer = \"adamw\"\nactivations = \"bf16\"\nbatch = 0\ncomponent = [{ name = \"a\", params = 1 }]\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.toml") && e.contains("paper.batch"), "{e}");
    let e = PaperConfig::from_toml_str("[paper]\nname = \"x\"\nweights = \"bf16\"\noptimizer = \"adamw\"\nactivations = \"bf16\"\nbatchh = 1\ncomponent = []\n", "y.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("y.toml") && e.contains("batchh"), "{e}");
    let bad_lora = "[paper]\nname = \"x\"\nweights = \"bf16\"\noptimizer = \"adamw\"\nactivations = \"bf16\"\n[[paper.component]]\nname = \"llm\"\nlora = { rank = 8, targets = [\"qq\"] }\n[paper.component.transformer]\nlayers = 1\nhidden = 64\nheads = 4\nintermediate = 128\nsequence = 8\n";
    let e = PaperConfig::from_toml_str(bad_lora, "z.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("z.toml") && e.contains("lora.targets") && e.contains("qq"),
        "{e}"
    );
    let e = PaperConfig::from_file("/nonexistent/p.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/p.toml"), "{e}");
    assert!(!is_paper_config("steps = 3\n[policy]\ntype = \"act\"\n"));
    assert!(!is_paper_config("paper = 3\n"));
}

#[test]
fn full_checkpointing_keeps_layer_inputs_plus_one_layer() {
    use vramlab_paper::config::Checkpointing;
    let mut cfg = load("vggt1b_llama2_7b_e2e.toml");
    let plain = estimate(&cfg);
    cfg.checkpointing = Checkpointing::Full;
    let ckpt = estimate(&cfg);
    // LLaMA: 32 inputs of s·b·h bf16 = 32 · 3144 · 4096 · 2 bytes; VGGT: 72 · 10992 · 1024 · 2.
    let inputs = 32.0 * 3144.0 * 4096.0 * 2.0 + 72.0 * 10992.0 * 1024.0 * 2.0;
    let llm = ckpt
        .components
        .iter()
        .find(|c| c.name == "llama2_7b")
        .unwrap();
    let logits = 2.0 * 3144.0 * 32000.0 * 4.0 + 3144.0 * 4096.0 * 2.0;
    let stored_layers: f64 = ckpt
        .components
        .iter()
        .filter(|c| c.name != "projector")
        .map(|c| c.stored_bytes)
        .sum::<f64>()
        - logits;
    assert!(
        (stored_layers - inputs).abs() < 1.0,
        "{stored_layers} vs {inputs}"
    );
    // The working set is one layer's full list: the larger of a LLaMA and a VGGT layer.
    let plain_llm = plain
        .components
        .iter()
        .find(|c| c.name == "llama2_7b")
        .unwrap();
    assert!(ckpt.working >= (plain_llm.stored_bytes - logits) / 32.0 - 1.0);
    assert!(llm.stored_bytes < plain_llm.stored_bytes / 5.0);
    assert!(
        ckpt.activations() < plain.activations() / 5.0,
        "{} vs {}",
        ckpt.activations(),
        plain.activations()
    );
}

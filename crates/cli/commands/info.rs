//! `vramlab info`: parameter counts and static bytes of a config, without training.

use anyhow::Result;
use vramlab_bytes::human;
use vramlab_workloads::{RunConfig, thousands};

pub fn run(cfg: &RunConfig) -> Result<()> {
    let report = vramlab_workloads::info(cfg)?;
    let (total, train) = (report.total(), report.trainable());
    println!("{}", report.title);
    println!("{:<28} {:>14} {:>14}", "module", "parameters", "trainable");
    for (m, n, t) in &report.rows {
        println!("{m:<28} {:>14} {:>14}", thousands(*n), thousands(*t));
    }
    println!("{:<28} {:>14} {:>14}", "total", thousands(total), thousands(train));
    println!("total parameters: {} ({total})", thousands(total));
    println!("trainable parameters: {} ({train})", thousands(train));
    for note in &report.notes {
        println!("{note}");
    }
    // Sizes of tensors that exist for the whole run: f32 master weights, one f32 gradient and
    // two f32 Adam moments per trainable parameter. Exact sizes, not a measurement of a run.
    let (p, g, o) = (4 * total, 4 * train, 8 * train);
    println!("static bytes (f32 params + grads + Adam state): {} = params {} + grads {} + optimizer {}", human(p + g + o), human(p), human(g), human(o));
    println!("static_bytes: {}", p + g + o);
    Ok(())
}

//! What `vramlab info` reports of a model: parameter counts per module ([`InfoReport`]), filled
//! by each model module's `info`.

use std::collections::BTreeMap;

/// Parameter counts of a config, per module: `(module, parameters, trainable)`.
pub struct InfoReport {
    /// The policy and its shape-deciding fields.
    pub title: String,
    pub rows: Vec<(String, u64, u64)>,
    /// Further lines (buffers that are not parameters).
    pub notes: Vec<String>,
}

impl InfoReport {
    pub fn total(&self) -> u64 {
        self.rows.iter().map(|r| r.1).sum()
    }

    pub fn trainable(&self) -> u64 {
        self.rows.iter().map(|r| r.2).sum()
    }
}

/// Rows grouped by the first segment of each parameter name.
pub fn rows_by_top_module(shapes: &[(String, Vec<usize>)]) -> Vec<(String, u64, u64)> {
    let mut per_module: BTreeMap<String, u64> = BTreeMap::new();
    for (name, shape) in shapes {
        let top = name.split('.').next().unwrap_or(name).to_string();
        *per_module.entry(top).or_default() += shape.iter().product::<usize>() as u64;
    }
    per_module.into_iter().map(|(m, n)| (m, n, n)).collect()
}

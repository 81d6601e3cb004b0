//! Print the report of each description given: `cargo run -p vramlab-paper --example report
//! -- configs/estimate/*.toml` (`--json` for the serialized report).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    for path in args.iter().filter(|a| *a != "--json") {
        match vramlab_paper::PaperConfig::from_file(path) {
            Ok(cfg) => {
                let r = vramlab_paper::report(&cfg);
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&r).unwrap_or_else(|e| e.to_string())
                    );
                } else {
                    println!("{}", r.markdown());
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        }
    }
}

//! Prints one generated problem as JSON (the `ilb optimize` format):
//! `gen_problem N M [SEED] [noisy | fleet] [overloaded]` (overloaded: 120 % load clustered, 108 %
//! noisy and fleet).
#![allow(clippy::disallowed_methods)] // an example program: reads its argv
use ilb_optimizer::gen::{generate, GenConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (n, m) =
        (numbers.first().copied().unwrap_or(100) as usize, numbers.get(1).copied().unwrap_or(5000) as usize);
    let seed = numbers.get(2).copied().unwrap_or(1);
    let flag = |f: &str| args.iter().any(|a| a == f);
    let config = match (flag("noisy"), flag("fleet"), flag("overloaded")) {
        (false, false, false) => GenConfig::new(n, m, seed),
        (false, false, true) => GenConfig::new(n, m, seed).overloaded(),
        (true, _, false) => GenConfig::noisy(n, m, seed),
        (true, _, true) => GenConfig::noisy(n, m, seed).with_load(1.08),
        (false, true, false) => GenConfig::fleet(n, m, seed),
        (false, true, true) => GenConfig::fleet(n, m, seed).with_load(1.08),
    };
    println!("{}", serde_json::to_string(&generate(&config)).expect("a problem serialises"));
}

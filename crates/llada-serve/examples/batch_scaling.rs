//! How a shared decode pass scales with the number of sequences: `n` sequences, each with a
//! context of `ctx` tokens, decode one token per pass; tokens/s over all sequences, the ceiling
//! of the server's continuous batching on this machine.
//!
//! `cargo run --release -p llada-serve --example batch_scaling -- MODEL [CTX] [N,N,…]`
use llada_model::{ForwardRequest, LoadOptions, Model, SeqPass};
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let path = a.get(1).expect("MODEL");
    let ctx: usize = a.get(2).map_or(128, |s| s.parse().unwrap());
    let ns: Vec<usize> = a
        .get(3)
        .map_or("1,2,4,8,16,32".into(), |s| s.clone())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let m = Model::load(path.as_ref(), &LoadOptions::default()).unwrap();
    let vocab = m.config.vocab as u32;
    for &n in &ns {
        let mut caches: Vec<_> = (0..n).map(|_| m.new_cache()).collect();
        for (i, c) in caches.iter_mut().enumerate() {
            let toks: Vec<u32> = (0..ctx as u32)
                .map(|t| (t * 31 + i as u32 * 7) % vocab)
                .collect();
            let pos: Vec<u32> = (0..ctx as u32).collect();
            m.forward(&ForwardRequest::causal_append(&toks, &pos), c)
                .unwrap();
        }
        let steps = 16;
        let t0 = Instant::now();
        for s in 0..steps {
            let toks: Vec<[u32; 1]> = (0..n).map(|i| [(s * 13 + i as u32) % vocab]).collect();
            let pos = [(ctx as u32) + s];
            let mut passes: Vec<SeqPass> = caches
                .iter_mut()
                .zip(&toks)
                .map(|(c, t)| SeqPass {
                    req: ForwardRequest::causal_append(t, &pos),
                    cache: c,
                })
                .collect();
            m.forward_many(&mut passes).unwrap();
        }
        let dt = t0.elapsed().as_secs_f64();
        // The same rows as one sequence's causal chunk (a prefill of n rows after ctx).
        let mut c = m.new_cache();
        let toks: Vec<u32> = (0..(ctx + n) as u32).map(|t| (t * 31) % vocab).collect();
        let pos: Vec<u32> = (0..(ctx + n) as u32).collect();
        m.forward(
            &ForwardRequest::causal_append(&toks[..ctx], &pos[..ctx]),
            &mut c,
        )
        .unwrap();
        let t1 = Instant::now();
        for _ in 0..steps {
            let mut cc = c.clone();
            m.forward(
                &ForwardRequest::causal_append(&toks[ctx..], &pos[ctx..]),
                &mut cc,
            )
            .unwrap();
        }
        let dt1 = t1.elapsed().as_secs_f64();
        println!(
            "{n:>3} sequences: {:7.2} ms/pass, {:7.1} tok/s | one sequence of {n} rows: {:7.2} ms/pass",
            dt / steps as f64 * 1e3,
            (n * steps as usize) as f64 / dt,
            dt1 / steps as f64 * 1e3
        );
    }
}

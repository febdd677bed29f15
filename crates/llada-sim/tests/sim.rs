//! The simulator against hand-computed traces, real traces recorded by the engine, and hostile
//! input.

use llada_sim::{simulate, simulate_full, Options, Profile, SimError, Trace};

/// A profile with round numbers: `cpu` 1 GFLOP/s and 1 GB/s, `npu` 10 GFLOP/s and 2 GB/s with
/// static shapes 8 and 16 (graph switch 1 s), bus 10 GB/s, flash 1 GB/s + 0.5 s per request.
fn toy() -> Profile {
    let s = |v: f64| serde_json::json!({"value": v, "source": "test"});
    let unit = |kind: &str, gf: f64, bw: f64| {
        serde_json::json!({
            "kind": kind, "gflops": {"value": [[1, gf]], "source": "test"},
            "vector_gflops": s(gf), "mem_gbs": s(bw), "op_overhead_us": s(0.0),
            "busy_w": s(2.0), "idle_w": s(1.0), "pj_per_op": s(1.0)
        })
    };
    let mut npu = unit("npu", 10.0, 2.0);
    npu["static_shapes"] = serde_json::json!({"value": [8, 16], "source": "test"});
    npu["graph_switch_us"] = s(1e6);
    let p = serde_json::json!({
        "name": "toy", "description": "test",
        "lanes": {"*": "cpu", "dense": "npu", "storage": "flash"},
        "units": {"cpu": unit("cpu", 1.0, 1.0), "npu": npu},
        "dram": {"shared_gbs": s(10.0), "pj_per_byte": s(1.0)},
        "flash": {"read_gbs": s(1.0), "request_latency_us": s(5e5), "pj_per_byte": s(2.0),
                  "busy_w": s(0.0), "idle_w": s(0.0)},
        "host_work_scale": s(1.0)
    });
    Profile::parse("toy", &p.to_string()).unwrap()
}

/// One trace line.
fn op(
    op: &str,
    lane: &str,
    pass: u64,
    layer: i32,
    shape: &[u64],
    (read, written, flops): (u64, u64, u64),
    t: (u64, u64),
) -> String {
    serde_json::json!({"op": op, "lane": lane, "pass": pass, "layer": layer, "shape": shape,
        "dtype": "F32", "bytes_read": read, "bytes_written": written, "flops": flops,
        "padded_rows": 0, "start_ns": t.0, "end_ns": t.1})
    .to_string()
}

fn trace(lines: &[String]) -> Trace {
    let text = format!("{{\"llada_trace\": 1}}\n{}\n", lines.join("\n"));
    Trace::parse(text.as_bytes()).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn a_compute_bound_operator_costs_its_flops_over_the_throughput() {
    // 2e9 FLOPs at 1 GFLOP/s = 2 s (its 1e6 bytes take 1 ms); then 0.5 s of host work and a
    // second operator of 1e9 FLOPs.
    let t = trace(&[
        op(
            "silu_mul",
            "sparse",
            1,
            0,
            &[4, 4],
            (500_000, 500_000, 2_000_000_000),
            (0, 10),
        ),
        op(
            "silu_mul",
            "sparse",
            1,
            0,
            &[4, 4],
            (0, 0, 1_000_000_000),
            (500_000_010, 500_000_020),
        ),
    ]);
    let r = simulate(&t, &toy(), &Options::default()).unwrap();
    assert!(close(r.predicted_total_s, 3.5), "{}", r.predicted_total_s);
    assert!(close(r.host_work_s, 0.5));
}

#[test]
fn overlapping_lanes_overlap_and_the_next_pass_waits_for_both() {
    // Pass 1 dense (npu, 16 rows: 16e9 FLOPs = 1.6 s) beside pass 2 sparse (cpu, 1e9 = 1 s);
    // pass 3 dense started after both ended in the trace: it waits for both.
    let t = trace(&[
        op(
            "silu_mul",
            "dense",
            1,
            0,
            &[16, 4],
            (0, 0, 16_000_000_000),
            (0, 100),
        ),
        op(
            "silu_mul",
            "sparse",
            2,
            0,
            &[4, 4],
            (0, 0, 1_000_000_000),
            (10, 90),
        ),
        op(
            "silu_mul",
            "dense",
            3,
            0,
            &[16, 4],
            (0, 0, 16_000_000_000),
            (100, 200),
        ),
    ]);
    let (r, rep) = simulate_full(&t, &toy(), &Options::default()).unwrap();
    let tl = &rep.timeline;
    assert_eq!(
        tl.start[1], 0.0,
        "the sparse pass starts beside the dense one"
    );
    assert!(
        close(tl.start[2], 1.6),
        "pass 3 starts when both ended: {}",
        tl.start[2]
    );
    assert!(close(r.predicted_total_s, 3.2));
    // Moving the sparse lane onto the NPU serialises it with the dense lane.
    let o = Options {
        map: Some("sparse=npu".into()),
        ..Default::default()
    };
    let (_, rep) = simulate_full(&t, &toy(), &o).unwrap();
    assert!(rep.timeline.start[1] >= rep.timeline.end[0]);
}

#[test]
fn a_storage_bound_pass_costs_its_bytes_over_the_flash_bandwidth() {
    // Layer 0's weights (2e9 bytes) are read from flash at 1 GB/s + 0.5 s latency = 2.5 s; the
    // layer's operator (npu, 8 rows, 8e8 FLOPs = 0.08 s) waits for them.
    let t = trace(&[
        op(
            "storage_read",
            "storage",
            1,
            0,
            &[2_000_000_000],
            (2_000_000_000, 2_000_000_000, 0),
            (0, 50),
        ),
        op(
            "silu_mul",
            "dense",
            1,
            0,
            &[8, 4],
            (0, 0, 800_000_000),
            (50, 70),
        ),
    ]);
    let (r, rep) = simulate_full(&t, &toy(), &Options::default()).unwrap();
    assert!(close(rep.timeline.end[0], 2.5));
    assert!(close(r.predicted_total_s, 2.58), "{}", r.predicted_total_s);
}

#[test]
fn static_shapes_pad_passes_and_charge_graph_switches() {
    // 5 rows run as 8 (8/5 of the FLOPs); the next pass of 12 rows runs as 16 and switches
    // graphs (1 s).
    let t = trace(&[
        op(
            "silu_mul",
            "dense",
            1,
            0,
            &[5, 4],
            (0, 0, 5_000_000_000),
            (0, 10),
        ),
        op(
            "silu_mul",
            "dense",
            2,
            0,
            &[12, 4],
            (0, 0, 12_000_000_000),
            (10, 20),
        ),
    ]);
    let r = simulate(&t, &toy(), &Options::default()).unwrap();
    assert_eq!(r.padded_rows, 3 + 4);
    assert_eq!(r.graph_switches, 1);
    assert!(
        close(r.predicted_total_s, 0.8 + 1.6 + 1.0),
        "{}",
        r.predicted_total_s
    );
}

#[test]
fn energy_is_busy_time_times_power_plus_traffic_and_operations() {
    let t = trace(&[
        op(
            "silu_mul",
            "sparse",
            1,
            0,
            &[4, 4],
            (1_000, 1_000, 1_000_000_000),
            (0, 10),
        ),
        op(
            "storage_read",
            "storage",
            1,
            0,
            &[1_000_000_000],
            (1_000_000_000, 1_000_000_000, 0),
            (0, 10),
        ),
    ]);
    let r = simulate(&t, &toy(), &Options::default()).unwrap();
    let span = r.predicted_total_s; // the flash read: 1.5 s
    assert!(close(span, 1.5));
    let e = &r.energy;
    // cpu: busy 1 s x 2 W + idle 0.5 s x 1 W; npu idle 1.5 s x 1 W; 1e9 ops x 1 pJ;
    // 2000 bytes x 1 pJ over the bus; 1e9 flash bytes x 2 pJ.
    assert!(close(e.busy_j, 2.0));
    assert!(close(e.idle_j, 0.5 + 1.5));
    assert!(close(e.ops_j, 1e-3));
    assert!(close(e.dram_j, 2000.0 * 1e-12));
    assert!(close(e.flash_j, 2e-3));
    let parts = e.busy_j + e.idle_j + e.ops_j + e.dram_j + e.in_memory_j + e.flash_j;
    assert!(close(e.total_j, parts));
    let units: f64 = r.units.iter().map(|u| u.energy_j).sum();
    assert!(close(units, e.total_j));
}

fn fixture(name: &str) -> Trace {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    Trace::load(&p).unwrap()
}

#[test]
fn a_real_diffusion_trace_replays_on_every_profile() {
    let t = fixture("diffusion-full.jsonl");
    assert_eq!(t.lanes(), vec!["dense", "sparse"]);
    for (name, _) in llada_sim::profile::BUILTIN {
        let p = Profile::load(name).unwrap();
        let (r, rep) = simulate_full(&t, &p, &Options::default()).unwrap();
        assert!(r.predicted_total_s > 0.0 && r.predicted_total_s.is_finite());
        // Lane order: a lane's operators never overlap, never run backwards.
        for i in 1..rep.ops.len() {
            for d in &rep.tasks[i].deps {
                assert!(rep.timeline.start[i] >= rep.timeline.end[*d] - 1e-12);
            }
        }
        // A unit never does two things at once; busy time is the sum of its tasks.
        for u in 0..rep.units.len() {
            let mut iv: Vec<(f64, f64)> = (0..rep.ops.len())
                .filter(|&i| rep.tasks[i].unit == u)
                .map(|i| (rep.timeline.start[i], rep.timeline.end[i]))
                .collect();
            let busy: f64 = iv.iter().map(|(a, b)| b - a).sum();
            assert!(close(busy, rep.timeline.busy[u]));
            iv.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(
                iv.windows(2).all(|w| w[1].0 >= w[0].1 - 1e-12),
                "{name}: unit {u} overlaps"
            );
        }
    }
    // On the host, the replay lands near the trace's own time (recorded on another run of this
    // machine kind: a loose bound; docs/sim.md gives the calibration table).
    let r = simulate(&t, &Profile::load("host").unwrap(), &Options::default()).unwrap();
    assert!(r.ratio > 0.25 && r.ratio < 4.0, "host ratio {}", r.ratio);
}

#[test]
fn the_schedule_recosts_at_llada_8b_with_the_same_rows_and_lanes() {
    let t = fixture("diffusion-full.jsonl");
    let p = Profile::load("sm8750").unwrap();
    let small = simulate(&t, &p, &Options::default()).unwrap();
    let o = Options {
        model_shape: Some("llada-8b".into()),
        ..Default::default()
    };
    let (big, rep) = simulate_full(&t, &p, &o).unwrap();
    assert_eq!(big.passes, small.passes);
    assert!(big.predicted_total_s > 100.0 * small.predicted_total_s);
    // 32 layers of q/k/v at LLaDA-8B's width, on the traced rows.
    let qkv: Vec<_> = rep
        .ops
        .iter()
        .filter(|o| o.op == "attn_qkv" && o.pass == 1)
        .collect();
    assert_eq!(qkv.len(), 32);
    assert_eq!(&qkv[0].shape[1..], &[3 * 4096, 4096]);
    assert_eq!(
        qkv[0].shape[0],
        t.ops.iter().find(|o| o.op == "attn_qkv").unwrap().shape[0]
    );
    assert!(
        big.kept_at_traced_cost.is_empty(),
        "{:?}",
        big.kept_at_traced_cost
    );
}

#[test]
fn a_streamed_trace_waits_for_its_reads() {
    let t = fixture("stream-ar.jsonl");
    let p = Profile::load("sm8750").unwrap();
    let o = Options {
        model_shape: Some("llama-3-8b".into()),
        weight_bits: Some(4.5),
        ..Default::default()
    };
    let (r, rep) = simulate_full(&t, &p, &o).unwrap();
    let flash = rep.units.iter().position(|u| u == "flash").unwrap();
    // Every byte read from flash at 4.2 GB/s: the flash is busy at least bytes / bandwidth.
    let bytes: f64 = (0..rep.ops.len())
        .filter(|&i| rep.tasks[i].unit == flash)
        .map(|i| rep.tasks[i].mem_bytes)
        .sum();
    assert!(bytes > 1e9);
    assert!(rep.timeline.busy[flash] >= bytes / 4.2e9);
    assert!(r.predicted_total_s >= rep.timeline.busy[flash]);
}

fn parse_err(text: &str) -> String {
    match Trace::parse(text.as_bytes()) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hostile_traces_are_refused_with_the_line() {
    let good = op("rmsnorm", "dense", 1, 0, &[1, 4], (1, 1, 1), (0, 5));
    let head = "{\"llada_trace\": 1}";
    assert!(parse_err("").contains("no header"));
    assert!(parse_err(head).contains("no operator records"));
    assert!(parse_err("{\"llada_trace\": 2}\n").contains("version 2"));
    assert!(parse_err("{\"op\": \"x\"}\n").contains("header"));
    assert!(parse_err("not json\n").contains("line 1"));
    let truncated = &good[..good.len() / 2];
    assert!(parse_err(&format!("{head}\n{truncated}\n")).contains("line 2"));
    let negative = good.replace("\"start_ns\":0", "\"start_ns\":-3");
    assert!(parse_err(&format!("{head}\n{negative}\n")).contains("line 2"));
    let backwards = op("rmsnorm", "dense", 1, 0, &[1, 4], (1, 1, 1), (9, 5));
    assert!(parse_err(&format!("{head}\n{backwards}\n")).contains("ends before it starts"));
    let absurd = op(
        "attn_qkv",
        "dense",
        1,
        0,
        &[1 << 40, 4, 4],
        (1, 1, 1),
        (0, 5),
    );
    assert!(parse_err(&format!("{head}\n{absurd}\n")).contains("absurd shape"));
    let missing = good.replace("\"lane\":\"dense\",", "");
    assert!(parse_err(&format!("{head}\n{good}\n{missing}\n")).contains("line 3"));
    // Every prefix of a real trace either parses or fails with an error, never a panic.
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/diffusion-full.jsonl"),
    )
    .unwrap();
    for cut in (0..text.len()).step_by(997) {
        let _ = Trace::parse(&text.as_bytes()[..cut]);
    }
}

#[test]
fn bad_profiles_and_names_are_clear_errors() {
    assert!(matches!(
        Profile::load("sm9999"),
        Err(SimError::UnknownProfile(..))
    ));
    let text = llada_sim::profile::BUILTIN[1].1;
    let unsourced = text.replacen("\"source\": \"", "\"source\": \"\", \"x\": \"", 1);
    assert!(Profile::parse("bad", &unsourced).is_err());
    let no_source = text.replace("\"source\"", "\"origin\"");
    let e = Profile::parse("bad", &no_source).unwrap_err().to_string();
    assert!(e.contains("bad"), "{e}");
    let mut p = toy();
    assert!(p.remap("dense=tpu").is_err());
    assert!(p.remap("dense").is_err());
    let t = fixture("diffusion-full.jsonl");
    let o = Options {
        model_shape: Some("gpt-5".into()),
        ..Default::default()
    };
    assert!(matches!(
        simulate(&t, &toy(), &o),
        Err(SimError::UnknownShape(..))
    ));
    let e = llada_sim::experiment::run("llada-cpp", "/nonexistent".as_ref()).unwrap_err();
    assert!(e.to_string().contains("sim_traces.sh"), "{e}");
}

#[test]
fn every_builtin_constant_names_a_source() {
    for (name, _) in llada_sim::profile::BUILTIN {
        let p = Profile::load(name).unwrap();
        for (k, _, s) in p.constants() {
            assert!(!s.trim().is_empty(), "{name}: {k}");
        }
    }
}

#[test]
fn a_host_profile_is_measured_from_a_bench_run() {
    let bench = serde_json::json!({"measured_bw_gbs": 20.0, "matmul": [
        {"dtype": "Q4_1", "m": 8, "ours_gflops": 100.0},
        {"dtype": "Q4_1", "m": 1, "ours_gflops": 50.0},
        {"dtype": "Q8_0", "m": 1, "ours_gflops": 40.0}]});
    let t = fixture("stream-ar.jsonl");
    let p =
        llada_sim::calibrate::host_from_bench(&bench, std::slice::from_ref(&t), "Q4_1").unwrap();
    let cpu = &p.units["cpu"];
    assert_eq!(cpu.gflops.value, vec![[1.0, 50.0], [8.0, 100.0]]);
    assert!(cpu
        .op_gflops
        .as_ref()
        .unwrap()
        .value
        .contains_key("attention"));
    assert!(p.flash.read_gbs.value > 0.0 && cpu.mem_gbs.value > 0.0);
    assert!(p
        .constants()
        .iter()
        .all(|(_, v, s)| v.is_finite() && !s.is_empty()));
    let r = simulate(&t, &p, &Options::default()).unwrap();
    assert!(r.predicted_total_s > 0.0);
    let e = llada_sim::calibrate::host_from_bench(&bench, &[t], "F16").unwrap_err();
    assert!(e.to_string().contains("no F16"), "{e}");
}

#[test]
fn draft_lane_passes_of_the_target_width_are_target_work() {
    // Pre-verification (TVC) runs the target on the draft lane: its passes keep the target's
    // width and are re-costed with --model-shape, not --draft-shape.
    let t = trace(&[
        op("rmsnorm", "dense", 1, 0, &[1, 8], (1, 1, 1), (0, 1)),
        op("rmsnorm", "draft", 2, 0, &[1, 4], (1, 1, 1), (1, 2)),
        op("rmsnorm", "draft", 3, 0, &[1, 8], (1, 1, 1), (2, 3)),
    ]);
    assert_eq!(llada_sim::target_ops(&t.ops), vec![true, false, true]);
    let o = Options {
        model_shape: Some("llama-3-8b@1".into()),
        draft_shape: Some("llama-3.2-1b@1".into()),
        ..Default::default()
    };
    let (_, rep) = simulate_full(&t, &toy(), &o).unwrap();
    let widths: Vec<u64> = rep.ops.iter().map(|o| o.shape[1]).collect();
    assert_eq!(widths, vec![4096, 2048, 4096]);
}

#[test]
fn one_operator_kind_of_a_lane_can_move_to_another_unit() {
    let t = trace(&[
        op(
            "rmsnorm",
            "sparse",
            1,
            0,
            &[1, 4],
            (0, 0, 1_000_000_000),
            (0, 1),
        ),
        op(
            "silu_mul",
            "sparse",
            1,
            0,
            &[1, 4],
            (0, 0, 1_000_000_000),
            (1, 2),
        ),
    ]);
    let o = Options {
        map: Some("sparse.silu_mul=npu".into()),
        ..Default::default()
    };
    let (r, rep) = simulate_full(&t, &toy(), &o).unwrap();
    let unit = |i: usize| rep.units[rep.tasks[i].unit].as_str();
    assert_eq!((unit(0), unit(1)), ("cpu", "npu"));
    // 1 s on the CPU, then 0.1 s on the NPU (10 GFLOP/s; one row pads to the 8-row shape).
    assert!(
        close(r.predicted_total_s, 1.0 + 0.8),
        "{}",
        r.predicted_total_s
    );
}

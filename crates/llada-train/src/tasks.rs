//! Checkable synthetic tasks in `prompt → answer` form, generated from a seed.
//!
//! | task | prompt | answer | answer length |
//! |---|---|---|---|
//! | `add` | `add:0…0123+0…04567=` (both operands zero-padded to [`ADD_WIDTH`] = 10 digits) | `0…04690` (11 digits) | 11 |
//! | `sort` | `sort:3 1 2=` (1–[`SORT_MAX`] = 32 digits) | `1 2 3` | 1–63 |
//! | `rev` | `rev:hello=` | `olleh` | 1–16 |
//! | `cumsum` | `cum:0…03141=` (zero-padded to [`CUM_WIDTH`] = 16 digits) | `0…03485` (running sum mod 10: every answer digit depends on the previous) | 16 |
//! | `multi` | `1>␣␣…add:…;2>␣␣…rev:ab;…;5>…=` | `1>…␣␣;2>ba␣␣…;…;5>…` (five numbered questions in fixed columns, one response) | 139 |
//!
//! Sums and running sums are **fixed-width**: the operands have 1–10 (1–16) significant digits
//! (fewer than the 1–16 (1–32) first tried, so that an exact match needs fewer digits right),
//! zero-padded, so every answer digit sits at the same distance from the
//! operand digits it depends on in every example. Position enters these bidirectional RoPE
//! models only through relative distances in attention; with natural-width numbers that distance
//! depends on the operands' lengths, and a 4-minute run on sums alone went from 0 % to 12.5 %
//! exact when the width was fixed (docs/training.md, "Synthetic tasks"). Word reversal needs
//! no padding: answer letter k reads the prompt 2k + 2 positions back whatever the word's length.
//! Answers of ≥ 128 characters come from multi-question responses.
//!
//! Multi-question prompts **number** their questions and answers (`2>` opens the second) and lay
//! them out in **fixed columns**: always [`MULTI_QUESTIONS`]
//! questions, each question right-aligned in a [`MULTI_SLOT`]-character slot (spaces on its
//! left) and each answer left-aligned in a slot of the same width (spaces on its right). The
//! distance from an answer character to the question characters it depends on then depends
//! only on its column, the same in every example (the same column of prompt and answer is
//! 140 positions apart), as zero padding made it for sums.
//! With free-length questions (an earlier layout) that distance depended on the lengths of every
//! other question and answer, and no model ever answered one (0 % exact).
//!
//! Sorts have at most [`SORT_MAX`] digits (with up to 72, no model sorted one exactly;
//! a sorted answer is right only if every digit's count is, and counts of up to ≈ 20 of each
//! digit were beyond these models).
//!
//! The held-out split is fixed: an example belongs to it iff a hash of its prompt falls in
//! bucket 0 of 16; training generators skip those prompts, so train and held-out never overlap.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One example.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub task: &'static str,
    pub prompt: String,
    pub answer: String,
}

pub const TASKS: [&str; 5] = ["add", "sort", "rev", "cumsum", "multi"];

/// Digits of a sum's operands (zero-padded); the answer has one more.
pub const ADD_WIDTH: usize = 10;
/// Digits of a running sum's input and answer (zero-padded).
pub const CUM_WIDTH: usize = 16;
/// Most digits in a sort question.
pub const SORT_MAX: usize = 32;
/// Sub-tasks of a multi-question prompt's items, drawn uniformly (the held-out split's draw).
pub const MULTI_SUBTASKS: [&str; 3] = ["add", "rev", "cumsum"];
/// Questions in a multi-question prompt.
pub const MULTI_QUESTIONS: usize = 5;
/// Width of a multi-question slot (question or answer, without its `N>` label): the longest
/// question, `add:` and two operands.
pub const MULTI_SLOT: usize = 4 + 2 * ADD_WIDTH + 1;

/// The longest answer `task` can have (characters): what an answer region must hold, plus an
/// EOS, for every example of the task to fit.
pub fn longest_answer(task: &str) -> usize {
    match task {
        "add" => ADD_WIDTH + 1,
        "sort" => 2 * SORT_MAX - 1,
        "rev" => 16,
        "cumsum" => CUM_WIDTH,
        _ => MULTI_QUESTIONS * (MULTI_SLOT + 3) - 1,
    }
}

fn digits(rng: &mut StdRng, n: usize) -> String {
    let mut s: String = (0..n)
        .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
        .collect();
    if n > 1 && s.starts_with('0') {
        s.replace_range(
            0..1,
            &char::from(b'1' + rng.random_range(0..9u8)).to_string(),
        );
    }
    s
}

fn add_strings(a: &str, b: &str) -> String {
    let (a, b): (Vec<u8>, Vec<u8>) = (
        a.bytes().rev().map(|c| c - b'0').collect(),
        b.bytes().rev().map(|c| c - b'0').collect(),
    );
    let mut out = vec![];
    let mut carry = 0;
    for i in 0..a.len().max(b.len()) {
        let s = a.get(i).copied().unwrap_or(0) + b.get(i).copied().unwrap_or(0) + carry;
        out.push(b'0' + s % 10);
        carry = s / 10;
    }
    if carry > 0 {
        out.push(b'0' + carry);
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Lengths are drawn uniformly from `[lo·max·scale, max·scale]` (at least 1).
fn one(rng: &mut StdRng, task: &'static str, scale: f64, lo: f64) -> (String, String) {
    let len = |rng: &mut StdRng, max: usize| {
        let hi = ((max as f64 * scale).ceil() as usize).max(1);
        let lo = ((max as f64 * scale * lo).ceil() as usize).clamp(1, hi);
        rng.random_range(lo..=hi)
    };
    match task {
        "add" => {
            let (la, lb) = (len(rng, ADD_WIDTH), len(rng, ADD_WIDTH));
            let (a, b) = (digits(rng, la), digits(rng, lb));
            let sum = add_strings(&a, &b);
            let w = ADD_WIDTH;
            (
                format!("add:{a:0>w$}+{b:0>w$}"),
                format!("{sum:0>width$}", width = w + 1),
            )
        }
        "sort" => {
            let n = len(rng, SORT_MAX);
            let v: Vec<u8> = (0..n).map(|_| rng.random_range(0..10)).collect();
            let mut s = v.clone();
            s.sort();
            let j = |v: &[u8]| {
                v.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            (format!("sort:{}", j(&v)), j(&s))
        }
        "rev" => {
            let n = len(rng, 16);
            let w: String = (0..n)
                .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                .collect();
            (format!("rev:{w}"), w.chars().rev().collect())
        }
        _ => {
            let l = len(rng, CUM_WIDTH);
            let d = digits(rng, l);
            let mut acc = 0u32;
            let out: String = d
                .bytes()
                .map(|c| {
                    acc = (acc + (c - b'0') as u32) % 10;
                    char::from(b'0' + acc as u8)
                })
                .collect();
            // Leading zeros add nothing to a running sum: the answer's padding is zeros too.
            let w = CUM_WIDTH;
            (format!("cum:{d:0>w$}"), format!("{out:0>w$}"))
        }
    }
}

/// Bucket of the held-out split (0 of 16).
pub fn is_held_out(prompt: &str) -> bool {
    // FNV-1a: stable across platforms and releases.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in prompt.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h.is_multiple_of(16)
}

/// A stream of examples. `scale` (0, 1] shrinks the length ranges (curriculum).
pub struct TaskGen {
    rng: StdRng,
    held_out: bool,
    pub scale: f64,
    /// Lower end of the length range, as a fraction of the upper end (0 = from length 1).
    /// Training batches use narrow bands so that EOS padding does not dominate the loss.
    pub lo: f64,
    pub tasks: Vec<&'static str>,
    /// Sub-tasks drawn (uniformly over the list) for each item of a multi-question example.
    pub multi_tasks: Vec<&'static str>,
}

impl TaskGen {
    pub fn new(seed: u64, held_out: bool) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            held_out,
            scale: 1.0,
            lo: 0.0,
            tasks: TASKS.to_vec(),
            multi_tasks: MULTI_SUBTASKS.to_vec(),
        }
    }

    /// Next example of a random task (or of `task`).
    ///
    /// # Panics
    ///
    /// When no prompt of this split turns up in [`MAX_DRAWS`] draws ([`TaskGen::try_next`]'s
    /// error): a length scale too small for the split. Lengths that come from a user (`llada
    /// train` and `llada eval --max-scale`) go through [`TaskGen::try_next`] instead.
    pub fn next(&mut self, task: Option<&'static str>) -> Example {
        match self.try_next(task) {
            Ok(e) => e,
            Err(e) => panic!("{e}"),
        }
    }

    /// Next example of a random task (or of `task`), or an error when [`MAX_DRAWS`] draws in a
    /// row all fell in the other split. At small length scales a task has only a handful of
    /// distinct prompts (`--max-scale 0.05`: ten running sums of one digit), and none of them
    /// may hash into this split's buckets; unbounded, the redraws never ended. Whenever an
    /// example is found it is the one [`TaskGen::next`] always drew: the stream of a seed is
    /// unchanged.
    pub fn try_next(&mut self, task: Option<&'static str>) -> anyhow::Result<Example> {
        for _ in 0..MAX_DRAWS {
            let t = task.unwrap_or_else(|| self.tasks[self.rng.random_range(0..self.tasks.len())]);
            let (prompt, answer) = if t == "multi" {
                let mut ps = vec![];
                let mut ans = vec![];
                for i in 1..=MULTI_QUESTIONS {
                    let sub = self.multi_tasks[self.rng.random_range(0..self.multi_tasks.len())];
                    let (p, a) = one(&mut self.rng, sub, self.scale, self.lo);
                    ps.push(format!("{i}>{p:>MULTI_SLOT$}"));
                    ans.push(format!("{i}>{a:<MULTI_SLOT$}"));
                }
                (ps.join(";"), ans.join(";"))
            } else {
                one(&mut self.rng, t, self.scale, self.lo)
            };
            let prompt = format!("{prompt}=");
            if is_held_out(&prompt) == self.held_out {
                return Ok(Example {
                    task: t,
                    prompt,
                    answer,
                });
            }
        }
        let what = match task {
            Some(t) => format!("task {t}"),
            None => format!("tasks {}", self.tasks.join(",")),
        };
        anyhow::bail!(
            "no {} example of {what} at length scale {} in {MAX_DRAWS} draws: at this scale \
             the task has too few distinct prompts for the split (a fixed 1 in 16 of them is \
             held out); use a larger length scale (--max-scale)",
            if self.held_out {
                "held-out"
            } else {
                "training"
            },
            self.scale
        )
    }
}

/// Draws [`TaskGen::try_next`] makes before it gives up: at full lengths a held-out draw
/// succeeds with probability ≈ 1/16, so 10⁵ failures in a row (probability ≈ e⁻⁶⁴⁵⁴) mean the
/// scale leaves the split empty, not bad luck; they take ≈ 0.1 s.
pub const MAX_DRAWS: usize = 100_000;

/// The fixed held-out split: `n` examples per task.
pub fn held_out_split(n: usize) -> Vec<Example> {
    held_out_subset(n, &TASKS, 1.0)
}

/// `n` held-out examples of each of `tasks` with lengths scaled by `scale` (experiments on
/// shorter tasks; `held_out_split` is the reported split).
///
/// # Panics
///
/// When `scale` leaves a task without held-out prompts ([`try_held_out_subset`] returns the
/// error instead).
pub fn held_out_subset(n: usize, tasks: &[&'static str], scale: f64) -> Vec<Example> {
    match try_held_out_subset(n, tasks, scale) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// [`held_out_subset`], or an error when `scale` is too small for some task to have held-out
/// prompts ([`TaskGen::try_next`]).
pub fn try_held_out_subset(
    n: usize,
    tasks: &[&'static str],
    scale: f64,
) -> anyhow::Result<Vec<Example>> {
    draw_per_task(TaskGen::new(0x5eed_0fe1d, true), n, tasks, scale)
}

/// `n` examples of each of `tasks` in turn from `g` at length scale `scale`.
fn draw_per_task(
    mut g: TaskGen,
    n: usize,
    tasks: &[&'static str],
    scale: f64,
) -> anyhow::Result<Vec<Example>> {
    g.scale = scale;
    let mut v = vec![];
    for &t in tasks {
        for _ in 0..n {
            v.push(g.try_next(Some(t))?);
        }
    }
    Ok(v)
}

/// How many held-out examples per task [`held_out_tasks`] draws as [`held_out_split`] does
/// before it continues task by task in rounds: the split the shipped cards were evaluated on
/// (`llada eval --per-task 50`).
pub const HELD_OUT_ORDER: usize = 50;

/// The first `n` held-out examples of each of `tasks` in one fixed order (at length scale
/// `scale`), so that `llada eval --per-task 20` scores a prefix of `--per-task 50`, and
/// `--tasks rev` the same reversals as the rev column of a full evaluation. The order: each
/// task's examples of [`held_out_split`]`(`[`HELD_OUT_ORDER`]`)`, then one more per task in
/// rounds from the same generator. An error when `scale` is too small for any task to have
/// held-out prompts.
pub fn held_out_tasks(
    n: usize,
    tasks: &[&'static str],
    scale: f64,
) -> anyhow::Result<Vec<Example>> {
    let mut g = TaskGen::new(0x5eed_0fe1d, true);
    g.scale = scale;
    let mut per_task: Vec<Vec<Example>> = vec![];
    for &t in &TASKS {
        per_task.push(
            (0..HELD_OUT_ORDER)
                .map(|_| g.try_next(Some(t)))
                .collect::<anyhow::Result<_>>()?,
        );
    }
    for _ in HELD_OUT_ORDER..n {
        for (i, &t) in TASKS.iter().enumerate() {
            per_task[i].push(g.try_next(Some(t))?);
        }
    }
    Ok(TASKS
        .iter()
        .zip(per_task)
        .filter(|(t, _)| tasks.contains(t))
        .flat_map(|(_, v)| v.into_iter().take(n))
        .collect())
}

/// Seed of the tuning split ([`tuning_tasks`]).
pub const TUNING_SEED: u64 = 0x7_0e1d;

/// The tuning split: `n` examples of each of `tasks` (at length scale `scale`) from the
/// training side of the split (prompts whose hash is outside the held-out bucket, from a
/// generator of its own seed), for choosing decoder settings without looking at the held-out
/// examples the reported figures come from: no tuning prompt is a held-out prompt. The models
/// may have trained on some of them (a training stream draws from the same side), so tuned
/// figures can read a little high; only their differences choose the settings.
pub fn tuning_tasks(n: usize, tasks: &[&'static str], scale: f64) -> anyhow::Result<Vec<Example>> {
    draw_per_task(TaskGen::new(TUNING_SEED, false), n, tasks, scale)
}

/// Character-level score of an answer: `(matches, total)`, where `matches` counts the positions
/// at which `got` has the expected character and `total = max(|expected|, |got|)`, so missing
/// and extra characters both count as errors. Exact match is the headline metric; this one
/// still separates a model that gets most of a long answer right from one that gets none.
pub fn char_score(expected: &str, got: &str) -> (usize, usize) {
    let matches = expected
        .chars()
        .zip(got.chars())
        .filter(|(a, b)| a == b)
        .count();
    (matches, expected.chars().count().max(got.chars().count()))
}

/// Tally of answers against their expected strings: exact matches and characters in place
/// ([`char_score`]). `llada eval` keeps one per task, `llada bench diffusion` one per run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Score {
    pub answers: usize,
    pub exact: usize,
    pub chars_in_place: usize,
    pub chars: usize,
    /// Sub-answers (the `;`-separated items of a multi-question answer; one per answer
    /// otherwise) and how many of them were exact: separates "every item nearly right" from
    /// "four of five items right" on the long answers.
    pub items: usize,
    pub items_exact: usize,
}

/// For each item of `expected` (split at `;`), whether `got` has it exactly at the same index:
/// the one in-place comparison behind [`item_score`] and [`item_outcomes`].
fn item_matches<'a>(expected: &'a str, got: &'a str) -> impl Iterator<Item = bool> + 'a {
    let mut have = got.split(';');
    expected
        .split(';')
        .map(move |want| have.next() == Some(want))
}

/// Items of `expected` (split at `;`) that `got` has exactly, at the same index: `(exact, total)`.
pub fn item_score(expected: &str, got: &str) -> (usize, usize) {
    item_matches(expected, got).fold((0, 0), |(e, t), ok| (e + usize::from(ok), t + 1))
}

/// The sub-task ([`MULTI_SUBTASKS`]'s name) of each item of a multi-question prompt, in order:
/// `1>␣␣add:…;2>␣␣rev:ab=` → `[Some("add"), Some("rev")]`; `None` for an item of another form
/// (a single question such as `rev:ab=` has no numbered items: `[None]`).
pub fn item_tasks(prompt: &str) -> Vec<Option<&'static str>> {
    prompt
        .trim_end_matches('=')
        .split(';')
        .map(|q| {
            let (label, body) = q.split_once('>')?;
            if label.is_empty() || !label.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            match body.trim_start().split(':').next() {
                Some("add") => Some("add"),
                Some("rev") => Some("rev"),
                Some("cum") => Some("cumsum"),
                _ => None,
            }
        })
        .collect()
}

/// Each item of a multi-question answer with its sub-task ([`item_tasks`]) and whether `got`
/// has it exactly in place ([`item_score`]'s comparison): what `llada eval` tallies per
/// sub-task, to tell which kind of question the long answers fail on.
pub fn item_outcomes(prompt: &str, expected: &str, got: &str) -> Vec<(&'static str, bool)> {
    item_tasks(prompt)
        .into_iter()
        .zip(item_matches(expected, got))
        .filter_map(|(kind, ok)| kind.map(|k| (k, ok)))
        .collect()
}

impl Score {
    /// Count one answer; returns whether it was exact.
    pub fn add(&mut self, expected: &str, got: &str) -> bool {
        let (m, n) = char_score(expected, got);
        let exact = expected == got;
        let (ie, it) = item_score(expected, got);
        self.items += it;
        self.items_exact += ie;
        self.answers += 1;
        self.exact += usize::from(exact);
        self.chars_in_place += m;
        self.chars += n;
        exact
    }

    pub fn merge(self, o: Score) -> Score {
        Score {
            answers: self.answers + o.answers,
            exact: self.exact + o.exact,
            chars_in_place: self.chars_in_place + o.chars_in_place,
            chars: self.chars + o.chars,
            items: self.items + o.items,
            items_exact: self.items_exact + o.items_exact,
        }
    }

    /// Exact-match rate; `None` before any answer.
    pub fn exact_rate(&self) -> Option<f64> {
        (self.answers > 0).then(|| self.exact as f64 / self.answers as f64)
    }

    /// Rate of exact sub-answers ([`item_score`]); `None` before any answer.
    pub fn item_rate(&self) -> Option<f64> {
        (self.items > 0).then(|| self.items_exact as f64 / self.items as f64)
    }

    /// Characters-in-place rate; `None` before any answer.
    pub fn char_rate(&self) -> Option<f64> {
        (self.answers > 0).then(|| self.chars_in_place as f64 / self.chars.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_score_counts_misses_and_extras() {
        assert_eq!(char_score("olleh", "olleh"), (5, 5));
        assert_eq!(char_score("olleh", "ollah"), (4, 5));
        assert_eq!(char_score("olleh", "oll"), (3, 5));
        assert_eq!(char_score("olleh", "ollehxx"), (5, 7));
        assert_eq!(char_score("12", ""), (0, 2));
        assert_eq!(char_score("", ""), (0, 0));
    }

    #[test]
    fn multi_items_follow_the_listed_subtasks() {
        let mut g = TaskGen::new(7, false);
        g.multi_tasks = vec!["rev"];
        for _ in 0..20 {
            let e = g.next(Some("multi"));
            assert_eq!(
                item_tasks(&e.prompt),
                vec![Some("rev"); MULTI_QUESTIONS],
                "{}",
                e.prompt
            );
        }
        // The default draw (the held-out split's) mixes all three.
        let kinds: std::collections::BTreeSet<Option<&str>> = held_out_split(10)
            .iter()
            .filter(|e| e.task == "multi")
            .flat_map(|e| item_tasks(&e.prompt))
            .collect();
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            [Some("add"), Some("cumsum"), Some("rev")]
        );
    }

    #[test]
    fn item_score_counts_exact_sub_answers_in_place() {
        assert_eq!(item_score("1>ab ;2>12 ;3>x  ", "1>ab ;2>13 ;3>x  "), (2, 3));
        // A lost separator shifts the later items: they no longer count.
        assert_eq!(item_score("1>ab;2>12;3>x", "1>ab2>12;3>x"), (0, 3));
        assert_eq!(item_score("olleh", "olleh"), (1, 1));
        assert_eq!(item_score("olleh", ""), (0, 1));
        // Per sub-task: the kinds come from the prompt, the outcomes from the same comparison.
        let prompt = "1>  add:01+02;2>   rev:ab;3>cum:0012=";
        assert_eq!(
            item_outcomes(prompt, "1>003;2>ba ;3>0013", "1>003;2>ab ;3>0013"),
            [("add", true), ("rev", false), ("cumsum", true)]
        );
        assert_eq!(
            item_outcomes(prompt, "1>003;2>ba ;3>0013", "1>003"),
            [("add", true), ("rev", false), ("cumsum", false)]
        );
        assert_eq!(item_tasks("sort:3 1="), [None]);
        assert_eq!(item_tasks("rev:ab="), [None]);
        assert!(item_outcomes("rev:ab=", "ba", "ba").is_empty());
        let mut s = Score::default();
        s.add("1>a;2>b", "1>a;2>c");
        s.add("olleh", "olleh");
        assert_eq!((s.items, s.items_exact, s.exact), (3, 2, 1));
    }

    #[test]
    fn answers_are_correct() {
        assert_eq!(add_strings("999", "1"), "1000");
        assert_eq!(add_strings("123", "4567"), "4690");
        // A sum question's operands (`add:A+B`, without `=`) and its answer, from `u128`s.
        let sum = |q: &str| {
            let (a, b) = q
                .strip_prefix("add:")
                .and_then(|o| o.split_once('+'))
                .expect("add question");
            let s: u128 = a.parse::<u128>().unwrap_or(0) + b.parse::<u128>().unwrap_or(0);
            ((a.len(), b.len()), format!("{s:0w$}", w = ADD_WIDTH + 1))
        };
        let mut g = TaskGen::new(1, false);
        for _ in 0..200 {
            let e = g.next(None);
            assert!(!is_held_out(&e.prompt));
            if e.task == "add" {
                let (widths, want) = sum(e.prompt.trim_end_matches('='));
                assert_eq!(widths, (ADD_WIDTH, ADD_WIDTH), "{}", e.prompt);
                assert_eq!(e.answer, want);
            }
            if e.task == "multi" {
                // Numbered questions in fixed columns, answered in order under the same
                // numbers: question i starts at i·(slot + 3) in the prompt, answer i at the
                // same offset in the answer.
                let qs: Vec<&str> = e.prompt.trim_end_matches('=').split(';').collect();
                let ans: Vec<&str> = e.answer.split(';').collect();
                assert_eq!(qs.len(), MULTI_QUESTIONS, "{}", e.prompt);
                assert_eq!(qs.len(), ans.len(), "{} -> {}", e.prompt, e.answer);
                assert_eq!(e.prompt.len(), e.answer.len() + 1, "{}", e.prompt);
                for (i, (q, a)) in qs.iter().zip(&ans).enumerate() {
                    let label = format!("{}>", i + 1);
                    let (q, a) = (
                        q.strip_prefix(&label).expect("numbered question"),
                        a.strip_prefix(&label).expect("numbered answer"),
                    );
                    assert_eq!((q.len(), a.len()), (MULTI_SLOT, MULTI_SLOT), "{q:?} {a:?}");
                    assert!(!q.ends_with(' ') && !a.starts_with(' '), "{q:?} {a:?}");
                    let (q, a) = (q.trim_start(), a.trim_end());
                    if let Some(w) = q.strip_prefix("rev:") {
                        assert_eq!(a, w.chars().rev().collect::<String>());
                    } else if let Some(d) = q.strip_prefix("cum:") {
                        let mut acc = 0;
                        let want: String = d
                            .bytes()
                            .map(|c| {
                                acc = (acc + (c - b'0')) % 10;
                                char::from(b'0' + acc)
                            })
                            .collect();
                        assert_eq!(a, want);
                    } else {
                        assert_eq!(a, sum(q).1);
                    }
                }
            }
            crate::vocab::CharVocab::encode(&e.prompt);
            crate::vocab::CharVocab::encode(&e.answer);
        }
    }

    #[test]
    fn a_task_alone_gets_its_examples_of_the_full_split() {
        let full = held_out_split(HELD_OUT_ORDER);
        for t in TASKS {
            let alone = held_out_tasks(6, &[t], 1.0).unwrap();
            let col: Vec<_> = full
                .iter()
                .filter(|e| e.task == t)
                .take(6)
                .cloned()
                .collect();
            assert_eq!(alone, col, "{t}");
            assert_eq!(alone.len(), 6);
        }
        // Not what a generator started at the task gives (the reason for the function).
        assert_ne!(
            held_out_subset(6, &["rev"], 1.0),
            held_out_tasks(6, &["rev"], 1.0).unwrap()
        );
    }

    /// `--per-task n` scores the first n of one order: a prefix of every larger n, within
    /// and beyond the cards' 50; the 50 are the cards' split.
    #[test]
    fn smaller_evaluations_are_prefixes_of_larger_ones() {
        let big = held_out_tasks(HELD_OUT_ORDER + 7, &TASKS, 1.0).unwrap();
        assert_eq!(big.len(), TASKS.len() * (HELD_OUT_ORDER + 7));
        for n in [1, 20, HELD_OUT_ORDER, HELD_OUT_ORDER + 3] {
            let small = held_out_tasks(n, &TASKS, 1.0).unwrap();
            for t in TASKS {
                let a: Vec<_> = small.iter().filter(|e| e.task == t).collect();
                let b: Vec<_> = big.iter().filter(|e| e.task == t).take(n).collect();
                assert_eq!(a, b, "{t}, n = {n}");
            }
        }
        assert_eq!(
            held_out_tasks(HELD_OUT_ORDER, &TASKS, 1.0).unwrap(),
            held_out_split(HELD_OUT_ORDER)
        );
    }

    /// `longest_answer` bounds every drawn answer and is reached.
    #[test]
    fn longest_answer_bounds_the_answers() {
        let v = held_out_tasks(2 * HELD_OUT_ORDER, &TASKS, 1.0).unwrap();
        for t in TASKS {
            let most = v
                .iter()
                .filter(|e| e.task == t)
                .map(|e| e.answer.len())
                .max();
            assert!(most.unwrap() <= longest_answer(t), "{t}");
        }
        // Fixed widths are always reached; five-question answers are always 139 characters.
        assert_eq!(longest_answer("multi"), 139);
        assert!(v
            .iter()
            .filter(|e| e.task == "multi")
            .all(|e| e.answer.len() == 139));
        assert!(v
            .iter()
            .any(|e| e.task == "sort" && e.answer.len() == longest_answer("sort")));
    }

    /// The tuning split never holds a held-out prompt, so settings chosen on it are chosen
    /// without the examples the reported figures come from.
    #[test]
    fn tuning_split_is_disjoint_from_the_held_out_split() {
        let tune = tuning_tasks(60, &TASKS, 1.0).unwrap();
        assert_eq!(tune.len(), 60 * TASKS.len());
        let eval = held_out_tasks(2 * HELD_OUT_ORDER, &TASKS, 1.0).unwrap();
        let eval: std::collections::HashSet<&str> =
            eval.iter().map(|e| e.prompt.as_str()).collect();
        for e in &tune {
            assert!(!is_held_out(&e.prompt), "{}", e.prompt);
            assert!(!eval.contains(e.prompt.as_str()), "{}", e.prompt);
        }
        for t in TASKS {
            assert_eq!(tune.iter().filter(|e| e.task == t).count(), 60, "{t}");
        }
    }

    /// At a length scale that leaves a task no held-out prompt (`--max-scale 0.05`: ten
    /// one-digit running sums, none in the held-out bucket), the draw ends with an error that
    /// names the task and the scale, instead of redrawing forever.
    #[test]
    fn a_scale_without_held_out_prompts_is_an_error() {
        let t0 = std::time::Instant::now();
        let mut g = TaskGen::new(0x5eed_0fe1d, true);
        g.scale = 0.05;
        let err = g.try_next(Some("cumsum")).unwrap_err().to_string();
        assert!(err.contains("task cumsum") && err.contains("0.05"), "{err}");
        assert!(err.contains("--max-scale"), "{err}");
        let mut g = TaskGen::new(3, true);
        g.scale = 0.05;
        g.tasks = vec!["cumsum"];
        let err = g.try_next(None).unwrap_err().to_string();
        assert!(err.contains("tasks cumsum"), "{err}");
        let err = held_out_tasks(1, &["rev"], 0.03).unwrap_err().to_string();
        assert!(err.contains("held-out"), "{err}");
        assert!(held_out_tasks(1, &["rev"], 0.3).is_ok());
        assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    }

    /// The bound changes no stream: where `next` returned, `try_next` returns the same
    /// examples in the same order (both splits, every task, narrow bands included), and the
    /// held-out split is the one the shipped cards were evaluated on.
    #[test]
    fn bounded_draws_keep_the_stream_of_a_seed() {
        /// The unbounded loop of the generator before the bound, as it was.
        fn unbounded(g: &mut TaskGen, task: Option<&'static str>) -> Example {
            loop {
                let t = task.unwrap_or_else(|| g.tasks[g.rng.random_range(0..g.tasks.len())]);
                let (prompt, answer) = if t == "multi" {
                    let mut ps = vec![];
                    let mut ans = vec![];
                    for i in 1..=MULTI_QUESTIONS {
                        let sub = g.multi_tasks[g.rng.random_range(0..g.multi_tasks.len())];
                        let (p, a) = one(&mut g.rng, sub, g.scale, g.lo);
                        ps.push(format!("{i}>{p:>MULTI_SLOT$}"));
                        ans.push(format!("{i}>{a:<MULTI_SLOT$}"));
                    }
                    (ps.join(";"), ans.join(";"))
                } else {
                    one(&mut g.rng, t, g.scale, g.lo)
                };
                let prompt = format!("{prompt}=");
                if is_held_out(&prompt) == g.held_out {
                    return Example {
                        task: t,
                        prompt,
                        answer,
                    };
                }
            }
        }
        for held_out in [false, true] {
            for (scale, lo) in [(1.0, 0.0), (0.3, 0.0), (0.5, 0.75)] {
                let (mut a, mut b) = (TaskGen::new(42, held_out), TaskGen::new(42, held_out));
                for g in [&mut a, &mut b] {
                    g.scale = scale;
                    g.lo = lo;
                }
                for k in 0..200 {
                    let task = [None, Some(TASKS[k % TASKS.len()])][k % 2];
                    assert_eq!(a.try_next(task).unwrap(), unbounded(&mut b, task));
                }
            }
        }
        let mut g = TaskGen::new(0x5eed_0fe1d, true);
        let first = g.next(Some("add"));
        assert_eq!(first, held_out_split(1)[0]);
    }

    #[test]
    fn split_is_fixed_and_disjoint_and_long_enough() {
        let a = held_out_split(20);
        let b = held_out_split(20);
        assert_eq!(a, b);
        assert!(a.iter().all(|e| is_held_out(&e.prompt)));
        let longest = a.iter().map(|e| e.answer.len()).max().unwrap_or(0);
        let shortest = a.iter().map(|e| e.answer.len()).min().unwrap_or(0);
        assert!(
            longest >= 128 && shortest <= 3,
            "answer lengths {shortest}..{longest}"
        );
    }
}

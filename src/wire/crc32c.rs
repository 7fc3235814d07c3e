//! CRC-32C (Castagnoli), the checksum of v2 record batches and producer snapshots, computed with
//! whichever of `crc_fast`'s two x86/aarch64 kernels is faster on the CPU we run on.
//!
//! Every mirrored byte is checksummed before it is exposed, so the CRC is a fixed share of the
//! data path (a fifth of one shard's CPU at 16 partitions × 1 MiB batches, benches/RESULTS.md,
//! session 21). `crc_fast` has two kernels for it: the "fusion" kernel, which interleaves the
//! CPU's CRC32 instruction with carry-less multiplication and is its choice for CRC-32C, and the
//! carry-less-multiplication folding it uses for any other CRC-32, which it takes when handed
//! the polynomial as custom parameters. Which is faster depends on the core: the CRC32
//! instruction issues once per cycle on recent Intel cores but once per three on AMD Zen, where
//! folding alone ran 9.5–9.9 GB/s against fusion's 7.0–7.6 on this project's test host (an AMD
//! EPYC VM without VPCLMULQDQ). Rather than guess from a CPU model a VM may hide, the first call
//! times both on the same buffer and keeps the faster; both give the same checksum, so the choice
//! can only change speed (`kernels_agree_with_the_reference_crate` below).

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use crate::limits::{CRC_CALIBRATION_BYTES, CRC_CALIBRATION_ROUNDS};

/// One way of computing CRC-32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `crc_fast`'s CRC-32/ISCSI: the CRC32 instruction fused with carry-less multiplication.
    Fusion,
    /// `crc_fast`'s generic carry-less-multiplication folding, given the Castagnoli polynomial.
    Folding,
}

impl Kernel {
    pub const ALL: [Kernel; 2] = [Kernel::Fusion, Kernel::Folding];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Fusion => "fusion",
            Kernel::Folding => "folding",
        }
    }

    /// CRC-32C of `data` with this kernel.
    pub fn checksum(self, data: &[u8]) -> u32 {
        // crc_fast's result is a u64 for every width; a 32-bit CRC fits its low half.
        match self {
            Kernel::Fusion => crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32,
            Kernel::Folding => crc_fast::checksum_with_params(*CASTAGNOLI, data) as u32,
        }
    }
}

/// CRC-32/ISCSI as custom parameters, which routes `crc_fast` to its folding kernel. Built once:
/// building derives the folding constants.
static CASTAGNOLI: LazyLock<crc_fast::CrcParams> = LazyLock::new(|| {
    crc_fast::CrcParams::new(
        "CRC-32/ISCSI (folding)",
        32,
        0x1EDC_6F41,
        0xFFFF_FFFF,
        true,
        0xFFFF_FFFF,
        0xE306_9283,
    )
});

/// The kernel every checksum uses, chosen by timing at first use.
static CHOSEN: LazyLock<Choice> = LazyLock::new(calibrate);

/// What the calibration measured, for the start-up log (`kmirror serve`) and `benches/batch.rs`.
#[derive(Debug, Clone, Copy)]
pub struct Choice {
    pub kernel: Kernel,
    /// Each kernel's best time over the calibration buffer, in `Kernel::ALL` order.
    pub best: [Duration; 2],
}

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    CHOSEN.kernel.checksum(data)
}

/// The kernel in use and the timings it was chosen by.
pub fn choice() -> Choice {
    *CHOSEN
}

fn calibrate() -> Choice {
    // Deterministic, incompressible-looking bytes: the kernels do not care, but a constant
    // buffer would invite a future kernel to special-case it.
    let buf: Vec<u8> = (0..CRC_CALIBRATION_BYTES as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut best = [Duration::MAX; 2];
    let mut sums = [0u32; 2];
    // Rounds alternate the kernels so a burst of noise (an interrupt, a neighbour VM) hits both;
    // the best of each is its speed.
    for _ in 0..CRC_CALIBRATION_ROUNDS {
        for (i, k) in Kernel::ALL.into_iter().enumerate() {
            let t = Instant::now();
            sums[i] = std::hint::black_box(k.checksum(std::hint::black_box(&buf)));
            best[i] = best[i].min(t.elapsed());
        }
    }
    assert_eq!(sums[0], sums[1], "CRC-32C kernels disagree");
    let kernel = if best[1] < best[0] {
        Kernel::Folding
    } else {
        Kernel::Fusion
    };
    Choice { kernel, best }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_standard_check_value() {
        for k in Kernel::ALL {
            assert_eq!(k.checksum(b"123456789"), 0xE306_9283, "{}", k.name());
        }
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn calibration_times_both_kernels() {
        let c = choice();
        assert!(c.best.iter().all(|d| *d < Duration::MAX));
        let mine = Kernel::ALL.iter().position(|k| *k == c.kernel).unwrap();
        assert!(
            c.best[mine] <= c.best[1 - mine],
            "the faster kernel is chosen: {c:?}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Every length and alignment (the kernels take different paths for heads, tails and
        /// short inputs) gives the reference crate's checksum with both kernels.
        #[test]
        fn kernels_agree_with_the_reference_crate(
            data in proptest::collection::vec(any::<u8>(), 0..5000),
            skip in 0usize..64,
        ) {
            let d = &data[skip.min(data.len())..];
            let want = ::crc32c::crc32c(d);
            for k in Kernel::ALL {
                prop_assert_eq!(k.checksum(d), want, "{}", k.name());
            }
        }
    }
}

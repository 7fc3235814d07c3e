//! Fuzz target `batch_validation`: see `kmirror::fuzz_entry::batch_validation` for the input layout and invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kmirror::fuzz_entry::batch_validation(data);
});

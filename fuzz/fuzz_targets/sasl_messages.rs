//! Fuzz target `sasl_messages`: see `kmirror::fuzz_entry::sasl_messages` for the input layout and invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kmirror::fuzz_entry::sasl_messages(data);
});

//! Fuzz target `request_frame`: see `kmirror::fuzz_entry::request_frame` for the input layout and invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kmirror::fuzz_entry::request_frame::request_frame(data);
});

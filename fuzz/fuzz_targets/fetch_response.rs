//! Fuzz target `fetch_response`: see `kmirror::fuzz_entry::fetch_response` for the input layout and invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kmirror::fuzz_entry::fetch_response(data);
});

//! Fuzz target `acl_requests`: see `kmirror::fuzz_entry::acl_requests` for the input layout and invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kmirror::fuzz_entry::acl_requests(data);
});

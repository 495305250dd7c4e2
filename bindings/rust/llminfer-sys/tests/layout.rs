//! The declared structs must be the loaded library's, byte for byte.

use llminfer_sys::*;
use std::ffi::{CStr, CString};

#[test]
fn every_struct_matches_the_library() {
    let problems = layout_mismatches();
    assert!(
        problems.is_empty(),
        "layout mismatches:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_public_struct_is_declared() {
    let declared: Vec<&str> = struct_layouts().iter().map(|l| l.name).collect();
    assert_eq!(
        declared.len(),
        15,
        "llm.h 1.2 has 13 public structs; the grammar (1.3) and adapter (1.4) params"
    );
    for layout in struct_layouts() {
        let name = CString::new(layout.name).unwrap();
        assert_ne!(
            unsafe { llm_struct_size(name.as_ptr()) },
            0,
            "{} unknown to the library",
            layout.name
        );
    }
}

#[test]
fn offsets_computed_in_rust_agree_with_size_of() {
    // Independent of the library: fields are in declaration order, inside the struct.
    for layout in struct_layouts() {
        let mut previous = 0;
        for (field, offset) in &layout.fields {
            assert!(
                *offset >= previous,
                "{}.{} out of order",
                layout.name,
                field
            );
            assert!(
                *offset < layout.size,
                "{}.{} past the end",
                layout.name,
                field
            );
            previous = *offset;
        }
    }
    assert_eq!(core::mem::size_of::<llm_event>(), 72);
    assert_eq!(offset_of!(llm_event, text), 16);
    assert_eq!(offset_of!(llm_session_params, kv_cache_bytes), 16);
}

#[test]
fn unknown_names_are_reported_as_such() {
    let bogus = CString::new("llm_no_such_struct").unwrap();
    let field = CString::new("no_such_field").unwrap();
    let event = CString::new("llm_event").unwrap();
    unsafe {
        assert_eq!(llm_struct_size(bogus.as_ptr()), 0);
        assert_eq!(
            llm_struct_offset(event.as_ptr(), field.as_ptr()),
            usize::MAX
        );
    }
}

#[test]
fn version_matches_the_header() {
    let number = unsafe { llm_version_number() };
    assert_eq!(
        number / 100,
        LLM_VERSION_NUMBER / 100,
        "another major.minor at run time"
    );
    assert!(number >= LLM_VERSION_NUMBER);
    let text = unsafe { CStr::from_ptr(llm_version_string()) }
        .to_str()
        .unwrap();
    assert_eq!(
        text,
        format!("{}.{}.{}", number / 10000, number / 100 % 100, number % 100)
    );
}

#[test]
fn sized_init_writes_only_the_callers_size() {
    unsafe {
        let mut params: llm_sampling_params = core::mem::zeroed();
        llm_sampling_params_init_sized(&mut params, core::mem::size_of::<llm_sampling_params>());
        assert_eq!(
            params.struct_size as usize,
            core::mem::size_of::<llm_sampling_params>()
        );
        assert_eq!(params.top_k, 40);
    }
}

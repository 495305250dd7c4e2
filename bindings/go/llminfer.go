package llminfer

/*
#cgo pkg-config: llminfer
#cgo LDFLAGS: -ldl
#include <stdint.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Token is a token id of a model's vocabulary.
type Token int32

// NoToken is "no such token" (LLM_TOKEN_NONE), e.g. for a model without BOS.
const NoToken Token = -1

// MinVersionNumber is the oldest library this binding runs with: it calls
// the functions and fields of API 1.2.
const MinVersionNumber = 10200

// VersionNumber is the loaded library's MAJOR*10000 + MINOR*100 + PATCH.
func VersionNumber() int { return int(C.llm_version_number()) }

// Version is the loaded library's "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.llm_version_string()) }

// HeaderVersionNumber is LLM_VERSION_NUMBER of the header this package was
// compiled against.
const HeaderVersionNumber = C.LLM_VERSION_NUMBER

// LayoutMismatch names a struct field that sits at another offset in the
// loaded library than in the header the binding was compiled with.
type LayoutMismatch struct {
	Struct, Field    string // Field is "" for the struct's size
	Binding, Library uint64
}

// LayoutMismatches compares the struct layouts this package was compiled
// with against the loaded library's (llm_struct_size, llm_struct_offset).
// Sizes may differ between versions, since structs only grow at the end
// and carry their struct_size; a field the library does not know (newer
// than the library) is not a mismatch either. Anything else is.
func LayoutMismatches() []LayoutMismatch {
	var out []LayoutMismatch
	table := C.shim_layout_table()
	for i := 0; ; i++ {
		entry := (*C.shim_layout_entry)(unsafe.Pointer(uintptr(unsafe.Pointer(table)) +
			uintptr(i)*unsafe.Sizeof(*table)))
		if entry.struct_name == nil {
			break
		}
		name, field := C.GoString(entry.struct_name), C.GoString(entry.field)
		ours := uint64(entry.value)
		if field == "" {
			theirs := uint64(C.llm_struct_size(entry.struct_name))
			if theirs == 0 {
				out = append(out, LayoutMismatch{name, "", ours, 0})
			}
			continue
		}
		theirs := uint64(C.llm_struct_offset(entry.struct_name, entry.field))
		if theirs != uint64(C.SIZE_MAX) && theirs != ours {
			out = append(out, LayoutMismatch{name, field, ours, theirs})
		}
	}
	return out
}

// StructSizes gives, for each struct the binding uses, its size in the
// header the package was compiled with and in the loaded library.
func StructSizes() map[string][2]uint64 {
	sizes := map[string][2]uint64{}
	table := C.shim_layout_table()
	for i := 0; ; i++ {
		entry := (*C.shim_layout_entry)(unsafe.Pointer(uintptr(unsafe.Pointer(table)) +
			uintptr(i)*unsafe.Sizeof(*table)))
		if entry.struct_name == nil {
			break
		}
		if C.GoString(entry.field) == "" {
			sizes[C.GoString(entry.struct_name)] = [2]uint64{
				uint64(entry.value), uint64(C.llm_struct_size(entry.struct_name))}
		}
	}
	return sizes
}

var (
	compatOnce sync.Once
	compatErr  error
)

// checkLibrary runs once before the first model is loaded, so that a
// library older than the binding or with other layouts is refused before
// any struct is handed to it.
func checkLibrary() error {
	compatOnce.Do(func() {
		if v := VersionNumber(); v < MinVersionNumber {
			compatErr = fmt.Errorf("llminfer: the loaded library is %s, the binding needs 1.2.0 or newer", Version())
			return
		}
		if m := LayoutMismatches(); len(m) > 0 {
			compatErr = fmt.Errorf("llminfer: struct layouts differ from the loaded library's: %s.%s is %d here and %d there",
				m[0].Struct, m[0].Field, m[0].Binding, m[0].Library)
		}
	})
	return compatErr
}

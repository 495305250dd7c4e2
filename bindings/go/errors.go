package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Status is a status code of the C library (llm_status). Its values never
// change. A Status is also an error, so that errors.Is(err, ErrLimit)
// tells which status an *Error carries.
type Status int

// The status codes of llm.h.
const (
	OK                 Status = 0
	ErrInvalidArgument Status = 1
	ErrOutOfMemory     Status = 2
	ErrIO              Status = 3
	ErrBadFormat       Status = 4
	ErrUnsupported     Status = 5
	ErrBufferTooSmall  Status = 6
	ErrLimit           Status = 7
	ErrInvalidUTF8     Status = 8
	ErrNotFound        Status = 9
	ErrCancelled       Status = 10
	ErrBackend         Status = 11
	ErrInternal        Status = 12
)

// ErrClosed is returned by every method of a Model, Session or Stream
// after its Close.
var ErrClosed = errors.New("llminfer: use of a closed handle")

// Name is the enumerator name, e.g. "LLM_ERR_LIMIT".
func (s Status) Name() string { return C.GoString(C.llm_status_name(C.llm_status(s))) }

// Description is the library's short text for the status, e.g. "limit exceeded".
func (s Status) Description() string { return C.GoString(C.llm_status_str(C.llm_status(s))) }

func (s Status) Error() string { return s.Name() + ": " + s.Description() }

// Error is a failed call of the C library: its status and the message the
// library gave for that very call.
type Error struct {
	Op         string // the binding's operation, e.g. "load model"
	Status     Status
	StatusName string // Status.Name(), kept so that the error prints on its own
	Message    string // the library's detailed message; may be empty
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = e.Status.Description()
	}
	return fmt.Sprintf("llminfer: %s: %s: %s", e.Op, e.StatusName, msg)
}

// Is makes errors.Is(err, ErrNotFound) true for an *Error with that status.
func (e *Error) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

func newError(op string, st C.llm_status, message string) error {
	s := Status(st)
	return &Error{Op: op, Status: s, StatusName: s.Name(), Message: message}
}

// takeError turns a shim's status and malloc'd message into an error and
// frees the message.
func takeError(op string, st C.llm_status, message *C.char) error {
	text := ""
	if message != nil {
		text = C.GoString(message)
		C.free(unsafe.Pointer(message))
	}
	if st == C.LLM_OK {
		return nil
	}
	return newError(op, st, text)
}

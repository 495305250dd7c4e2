// Package llminfer runs large language models through libllminfer, the C
// library declared in llm.h, found with pkg-config ("llminfer").
//
// A Model is a loaded GGUF file; a Session holds KV memory and schedules
// requests on it. Generate returns a whole continuation; Stream and
// StreamChannel hand out tokens as the session produces them; Submit,
// Step and Cancel are the request API underneath for callers that drive
// the scheduler themselves.
//
// # Goroutines
//
// Model: every method may be called from any number of goroutines at
// once. Session: Submit, Cancel, Interrupt, Stats, LastError and Close
// may be called from any goroutine at any time, also while another
// goroutine steps. Step, Generate and Stream.Next step the session; they
// take turns (one waits while another steps), so they too may be called
// from several goroutines, and each Stream receives its own request's
// events whoever steps. A single Stream is read (Next, Token) by one
// goroutine at a time; its Close, Err and FinishReason are safe from any.
//
// # Errors
//
// A failed library call returns an *Error with the status, its name and
// the library's message for that very call: the binding copies the
// message in the same C call as the failure (a goroutine may change OS
// threads between two cgo calls, and llm_last_error is per thread).
// errors.Is(err, ErrLimit) and the other Status values test the status.
// Methods of closed handles return ErrClosed; a call stopped by its
// context returns a *CancelledError, which matches both ctx.Err() and
// ErrCancelled.
//
// # Lifetimes
//
// Close frees a handle at once and may be called more than once;
// finalizers free forgotten handles, but only Close frees them at a known
// time. A Session keeps its Model (and draft model) loaded until it is
// closed. Closing a Session interrupts its running calls and ends its
// Streams with ErrClosed. Closing or cancelling a Stream cancels its
// request, which frees its KV blocks.
package llminfer

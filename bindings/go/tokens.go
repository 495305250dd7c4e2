package llminfer

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"runtime"
	"unsafe"
)

// Token level: sequences the program decodes itself (llm_seq_*, llm_batch,
// llm_session_decode, llm_session_logits), their saved states, and the
// standalone sampler. The library does not make these thread-safe; the
// binding runs each call in the session's step turn, so they never overlap
// a Step, Generate or Stream.Next of the same session.

// SeqID names a token-level sequence of a session (llm_seq_id).
type SeqID int32

// tokenCall runs fn in the session's step turn with the handle held open.
func (s *Session) tokenCall(fn func(ptr *C.llm_session) error) error {
	c := s.c
	if err := c.takeTurn(context.Background()); err != nil {
		return err
	}
	defer c.endTurn()
	if err := c.acquire(); err != nil {
		return err
	}
	defer c.mu.RUnlock()
	return fn(c.ptr)
}

// SeqOpen opens an empty sequence.
func (s *Session) SeqOpen() (SeqID, error) {
	var id C.llm_seq_id
	err := s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		return takeError("open sequence", C.shim_seq_open(p, &id, &msg), msg)
	})
	return SeqID(id), err
}

// SeqFork opens a sequence sharing every KV block of src (copy-on-write).
func (s *Session) SeqFork(src SeqID) (SeqID, error) {
	var id C.llm_seq_id
	err := s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		return takeError("fork sequence", C.shim_seq_fork(p, C.llm_seq_id(src), &id, &msg), msg)
	})
	if err == nil {
		s.c.forkSeqAdapter(src, SeqID(id))
	}
	return SeqID(id), err
}

// SeqClose closes a sequence and frees its blocks.
func (s *Session) SeqClose(seq SeqID) error {
	err := s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		return takeError("close sequence", C.shim_seq_close(p, C.llm_seq_id(seq), &msg), msg)
	})
	if err == nil {
		s.c.holdSeqAdapter(seq, nil)
	}
	return err
}

// SeqTruncate forgets the positions from n on (to roll back or branch).
func (s *Session) SeqTruncate(seq SeqID, n int) error {
	return s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		st := C.shim_seq_truncate(p, C.llm_seq_id(seq), C.uint32_t(n), &msg)
		return takeError("truncate sequence", st, msg)
	})
}

// SeqLen is the number of positions the sequence holds.
func (s *Session) SeqLen(seq SeqID) (int, error) {
	var n C.uint32_t
	err := s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		return takeError("sequence length", C.shim_seq_length(p, C.llm_seq_id(seq), &n, &msg), msg)
	})
	return int(n), err
}

// SeqTokens gives the tokens the sequence holds.
func (s *Session) SeqTokens(seq SeqID) ([]Token, error) {
	var out []Token
	err := s.tokenCall(func(p *C.llm_session) error {
		var n C.uint32_t
		var msg *C.char
		if err := takeError("sequence length", C.shim_seq_length(p, C.llm_seq_id(seq), &n, &msg), msg); err != nil {
			return err
		}
		buf := make([]C.llm_token, int(n)+1)
		var got C.size_t
		st := C.shim_seq_tokens(p, C.llm_seq_id(seq), &buf[0], C.size_t(len(buf)), &got, &msg)
		if err := takeError("sequence tokens", st, msg); err != nil {
			return err
		}
		out = make([]Token, int(got))
		for i := range out {
			out[i] = Token(buf[i])
		}
		return nil
	})
	return out, err
}

// Batch holds one step's rows: (sequence, position, token, want logits).
// Close frees it (a finalizer does too).
type Batch struct {
	ptr  *C.llm_batch
	rows int
}

// NewBatch makes a batch of up to capacity rows.
func NewBatch(capacity int) (*Batch, error) {
	var ptr *C.llm_batch
	var msg *C.char
	if err := takeError("create batch", C.shim_batch_create(C.uint32_t(capacity), &ptr, &msg), msg); err != nil {
		return nil, err
	}
	b := &Batch{ptr: ptr}
	runtime.SetFinalizer(b, (*Batch).Close)
	return b, nil
}

// Add appends a row and returns its index; a sequence's rows continue at
// its length. A full batch is ErrLimit.
func (b *Batch) Add(seq SeqID, pos int, token Token, wantLogits bool) (int, error) {
	if b.ptr == nil {
		return 0, ErrClosed
	}
	var msg *C.char
	st := C.shim_batch_add(b.ptr, C.llm_seq_id(seq), C.uint32_t(pos), C.llm_token(token),
		C.bool(wantLogits), &msg)
	if err := takeError("batch add", st, msg); err != nil {
		return 0, err
	}
	b.rows++
	return b.rows - 1, nil
}

// Len is the number of rows added since the last Clear.
func (b *Batch) Len() int { return b.rows }

// Clear empties the batch.
func (b *Batch) Clear() {
	if b.ptr != nil {
		C.llm_batch_clear(b.ptr)
	}
	b.rows = 0
}

// Close frees the batch; closing again does nothing.
func (b *Batch) Close() error {
	if b.ptr != nil {
		C.llm_batch_free(b.ptr)
		b.ptr = nil
		runtime.SetFinalizer(b, nil)
	}
	return nil
}

// Decode computes every row of the batch in one forward pass, all or
// nothing.
func (s *Session) Decode(b *Batch) error {
	if b.ptr == nil {
		return ErrClosed
	}
	return s.tokenCall(func(p *C.llm_session) error {
		var msg *C.char
		return takeError("decode", C.shim_session_decode(p, b.ptr, &msg), msg)
	})
}

// Logits returns a copy of the logits (the vocabulary's size) of row row of
// the last Decode, which must have asked for them.
func (s *Session) Logits(row int) ([]float32, error) {
	info, err := s.c.model.Info()
	if err != nil {
		return nil, err
	}
	var out []float32
	err = s.tokenCall(func(p *C.llm_session) error {
		var ptr *C.float
		var msg *C.char
		if err := takeError("logits", C.shim_session_logits(p, C.uint32_t(row), &ptr, &msg), msg); err != nil {
			return err
		}
		out = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(ptr)), info.Vocab)...)
		return nil
	})
	return out, err
}

// saveState runs a save call of llm.h's "too small: here is the size" shape.
func saveState(op string, save func(buf unsafe.Pointer, capacity C.size_t, size *C.size_t, msg **C.char) C.llm_status) ([]byte, error) {
	var size C.size_t
	var msg *C.char
	if st := save(nil, 0, &size, &msg); st != C.LLM_ERR_BUFFER_TOO_SMALL {
		if err := takeError(op, st, msg); err != nil {
			return nil, err
		}
	}
	buf := C.malloc(size + 1)
	defer C.free(buf)
	if err := takeError(op, save(buf, size+1, &size, &msg), msg); err != nil {
		return nil, err
	}
	return C.GoBytes(buf, C.int(size)), nil
}

// SeqStateSave saves a sequence: its tokens and K/V.
func (s *Session) SeqStateSave(seq SeqID) ([]byte, error) {
	var out []byte
	err := s.tokenCall(func(p *C.llm_session) (err error) {
		out, err = saveState("save sequence state", func(buf unsafe.Pointer, capacity C.size_t, size *C.size_t, msg **C.char) C.llm_status {
			return C.shim_seq_state_save(p, C.llm_seq_id(seq), buf, capacity, size, msg)
		})
		return err
	})
	return out, err
}

// SeqStateLoad opens a new sequence from a state of SeqStateSave (this
// session's or another's on the same model).
func (s *Session) SeqStateLoad(data []byte) (SeqID, error) {
	var id C.llm_seq_id
	err := s.tokenCall(func(p *C.llm_session) error {
		buf := C.CBytes(data)
		defer C.free(buf)
		var msg *C.char
		st := C.shim_seq_state_load(p, buf, C.size_t(len(data)), &id, &msg)
		return takeError("load sequence state", st, msg)
	})
	return SeqID(id), err
}

// StateSave saves every open token-level sequence with its id.
func (s *Session) StateSave() ([]byte, error) {
	var out []byte
	err := s.tokenCall(func(p *C.llm_session) (err error) {
		out, err = saveState("save session state", func(buf unsafe.Pointer, capacity C.size_t, size *C.size_t, msg **C.char) C.llm_status {
			return C.shim_session_state_save(p, buf, capacity, size, msg)
		})
		return err
	})
	return out, err
}

// StateLoad re-creates the sequences of a StateSave under their ids; the
// session must have no token-level sequence open.
func (s *Session) StateLoad(data []byte) error {
	return s.tokenCall(func(p *C.llm_session) error {
		buf := C.CBytes(data)
		defer C.free(buf)
		var msg *C.char
		return takeError("load session state", C.shim_session_state_load(p, buf, C.size_t(len(data)), &msg), msg)
	})
}

// Sampler is the standalone sampler (llm_sampler): the library's sampling
// chain on logits the program has, with random numbers keyed by (seed,
// stream, position). Not safe for concurrent use; Close frees it.
type Sampler struct {
	ptr     *C.llm_sampler
	model   *Model
	vocab   int
	release func() // gives back the grammar
}

// NewSampler makes a sampler for model's vocabulary; nil sampling is greedy.
func NewSampler(model *Model, sampling *Sampling, stream uint64) (*Sampler, error) {
	info, err := model.Info()
	if err != nil {
		return nil, err
	}
	if err := model.acquire(); err != nil {
		return nil, err
	}
	defer model.mu.RUnlock()
	var arena cArena
	defer arena.free()
	params := arena.sampling(sampling)
	// The sampler's grammar state reads the grammar until Close.
	release, err := lendSampling(sampling, params)
	if err != nil {
		return nil, err
	}
	var ptr *C.llm_sampler
	var msg *C.char
	st := C.shim_sampler_create(model.ptr, params, C.uint64_t(stream), &ptr, &msg)
	if err := takeError("create sampler", st, msg); err != nil {
		release()
		return nil, err
	}
	sp := &Sampler{ptr: ptr, model: model, vocab: info.Vocab, release: release}
	runtime.SetFinalizer(sp, (*Sampler).Close)
	return sp, nil
}

// Sample picks a token from logits (the vocabulary's size); history holds
// the tokens so far (for the penalties), nGenerated how many of them were
// generated, position the index the token will take in its sequence.
func (sp *Sampler) Sample(logits []float32, history []Token, nGenerated int, position uint64) (Token, error) {
	if sp.ptr == nil {
		return 0, ErrClosed
	}
	if len(logits) != sp.vocab {
		return 0, newError("sample", C.LLM_ERR_INVALID_ARGUMENT, "logits of a different vocabulary size")
	}
	var hist *C.llm_token
	if len(history) > 0 {
		h := C.malloc(C.size_t(len(history)) * C.sizeof_llm_token)
		defer C.free(h)
		copy(unsafe.Slice((*Token)(h), len(history)), history)
		hist = (*C.llm_token)(h)
	}
	lg := C.malloc(C.size_t(len(logits)) * 4)
	defer C.free(lg)
	copy(unsafe.Slice((*float32)(lg), len(logits)), logits)
	var out C.llm_token
	var msg *C.char
	st := C.shim_sampler_sample(sp.ptr, (*C.float)(lg), hist, C.size_t(len(history)),
		C.uint32_t(nGenerated), C.uint64_t(position), &out, &msg)
	if err := takeError("sample", st, msg); err != nil {
		return 0, err
	}
	runtime.KeepAlive(sp.model)
	return Token(out), nil
}

// Close frees the sampler; closing again does nothing.
func (sp *Sampler) Close() error {
	if sp.ptr != nil {
		C.llm_sampler_free(sp.ptr)
		sp.ptr = nil
		runtime.SetFinalizer(sp, nil)
		sp.release()
	}
	return nil
}

package llminfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The test adapter: a llama.cpp LoRA GGUF written here, with no library,
// for the test model's shapes. Rank 4, alpha 8, on attn_q and ffn_up of
// every layer; values (u - 0.5) / 2 from splitmix64 (seed 31) with u the
// top 24 bits over 2^24, A before B, layer by layer. The Rust tests write
// the same bytes (bindings/rust/llminfer/tests/adapter.rs): for
// SmolLM2-135M its FNV-1a 64 is testAdapterFNV.
const testAdapterFNV = 0x6a945cb9facd1df6

func writeTestAdapter(t *testing.T, m *Model) string {
	t.Helper()
	requireAPI(t, 10400, "LoRA adapters", func() error {
		_, err := LoadAdapter(m, "test-lora.gguf", nil)
		return err
	})
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	const rank = 4
	state := uint64(31)
	next := func() float32 {
		state += 0x9E3779B97F4A7C15
		z := state
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		return (float32(z>>40)/16777216 - 0.5) * 0.5
	}
	type tensor struct {
		name   string
		ne     [2]uint64
		values []float32
	}
	var tensors []tensor
	for l := 0; l < info.Layers; l++ {
		for _, target := range []struct {
			name    string
			in, out int
		}{{"attn_q", info.Embedding, info.Embedding}, {"ffn_up", info.Embedding, info.FeedForward}} {
			a := make([]float32, rank*target.in)
			for i := range a {
				a[i] = next()
			}
			b := make([]float32, target.out*rank)
			for i := range b {
				b[i] = next()
			}
			prefix := "blk." + strconv.Itoa(l) + "." + target.name + ".weight"
			tensors = append(tensors,
				tensor{prefix + ".lora_a", [2]uint64{uint64(target.in), rank}, a},
				tensor{prefix + ".lora_b", [2]uint64{rank, uint64(target.out)}, b})
		}
	}
	var f bytes.Buffer
	le := binary.LittleEndian
	put := func(v any) { binary.Write(&f, le, v) }
	str := func(s string) { put(uint64(len(s))); f.WriteString(s) }
	const typeF32, typeString = 6, 8
	f.WriteString("GGUF")
	put(uint32(3))
	put(uint64(len(tensors)))
	put(uint64(4))
	for _, kv := range [][2]string{{"general.architecture", info.Architecture},
		{"general.type", "adapter"}, {"adapter.type", "lora"}} {
		str(kv[0])
		put(uint32(typeString))
		str(kv[1])
	}
	str("adapter.lora.alpha")
	put(uint32(typeF32))
	put(float32(8))
	pad := func(n int) int { return (n + 31) / 32 * 32 }
	offset := 0
	for _, tn := range tensors {
		str(tn.name)
		put(uint32(2))
		put(tn.ne)
		put(uint32(0)) // F32
		put(uint64(offset))
		offset = pad(offset + 4*len(tn.values))
	}
	f.Write(make([]byte, pad(f.Len())-f.Len()))
	base := f.Len()
	for _, tn := range tensors {
		put(tn.values)
		f.Write(make([]byte, base+pad(f.Len()-base)-f.Len()))
	}
	path := filepath.Join(t.TempDir(), "test-lora.gguf")
	if err := os.WriteFile(path, f.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if info.Layers == 30 && info.Embedding == 576 && info.FeedForward == 1536 {
		h := fnv.New64a()
		h.Write(f.Bytes())
		if h.Sum64() != testAdapterFNV {
			t.Fatalf("the test adapter's bytes changed: FNV-1a %#x, want %#x", h.Sum64(), uint64(testAdapterFNV))
		}
	}
	return path
}

func testAdapter(t *testing.T, m *Model) (*Adapter, string) {
	t.Helper()
	path := writeTestAdapter(t, m)
	a, err := LoadAdapter(m, path, nil)
	if err != nil {
		t.Fatalf("LoadAdapter: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a, path
}

// Greedy generation with the adapter is llm-run's with --lora, and differs
// from the base model's; requests and streams give the same tokens.
func TestAdapterMatchesLLMRun(t *testing.T) {
	m := testModel(t)
	a, path := testAdapter(t, m)
	const n = 16
	s := testSession(t, m)
	prompt := tokenize(t, m, referencePrompt)
	with, err := s.Generate(context.Background(), prompt,
		&GenerateOptions{MaxNewTokens: n, IgnoreEOS: true, Adapter: a, AdapterScale: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	without, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: n, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if sameTokens(with.Tokens, without.Tokens) {
		t.Fatalf("the adapter changed nothing: %v", with.Tokens)
	}
	if run := os.Getenv("LLMINFER_RUN"); run != "" {
		cmd := exec.Command(run, "-q", "-m", os.Getenv("LLMINFER_TEST_MODEL"), "-p", referencePrompt,
			"-n", strconv.Itoa(n), "--temp", "0", "-t", "2", "--lora", path, "--lora-scale", "0.5")
		want, err := cmd.Output()
		if err != nil {
			t.Fatalf("llm-run --lora: %v", err)
		}
		if got := referencePrompt + with.Text + "\n"; got != string(want) {
			t.Fatalf("binding: %q\nllm-run: %q", got, want)
		}
	} else {
		t.Log("LLMINFER_RUN is not set: no comparison with llm-run")
	}

	opts := &RequestOptions{MaxNewTokens: n, IgnoreEOS: true, Adapter: a, AdapterScale: 0.5}
	stream, err := s.Stream(context.Background(), prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := collectStream(t, stream); !sameTokens(got, with.Tokens) {
		t.Fatalf("stream %v, generate %v", got, with.Tokens)
	}
	if a.InUse() != 0 {
		t.Fatalf("a finished request still holds the adapter (%d uses)", a.InUse())
	}
	id, err := s.Submit(prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	if a.InUse() != 1 {
		t.Fatalf("a running request does not hold the adapter (%d uses)", a.InUse())
	}
	if got := stepRequest(t, s, id); !sameTokens(got, with.Tokens) {
		t.Fatalf("request %v, generate %v", got, with.Tokens)
	}
	if a.InUse() != 0 {
		t.Fatalf("a finished request still holds the adapter (%d uses)", a.InUse())
	}
}

// stepRequest steps until request id finishes and returns its tokens.
func stepRequest(t *testing.T, s *Session, id RequestID) []Token {
	t.Helper()
	var tokens []Token
	for {
		events, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			if ev.Request != id {
				continue
			}
			if ev.Token != NoToken {
				tokens = append(tokens, ev.Token)
			}
			if ev.Finish != FinishNone {
				if ev.Err != nil {
					t.Fatalf("request failed: %v", ev.Err)
				}
				return tokens
			}
		}
	}
}

// promptLogits decodes prompt on a new sequence with adapter at scale
// (none when adapter is nil) and returns the last position's logits.
func promptLogits(t *testing.T, s *Session, prompt []Token, adapter *Adapter, scale float32) []float32 {
	t.Helper()
	seq, err := s.SeqOpen()
	if err != nil {
		t.Fatal(err)
	}
	defer s.SeqClose(seq)
	if adapter != nil {
		if err := s.SeqSetAdapter(seq, adapter, scale); err != nil {
			t.Fatal(err)
		}
	}
	b, err := NewBatch(len(prompt))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i, tok := range prompt {
		if _, err := b.Add(seq, i, tok, i == len(prompt)-1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Decode(b); err != nil {
		t.Fatal(err)
	}
	logits, err := s.Logits(len(prompt) - 1)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}

// At scale 0 a sequence's logits are the base model's, bit for bit; at
// 0.5 they move, and greedy decoding by hand follows Generate's tokens.
func TestAdapterSequenceScale(t *testing.T) {
	m := testModel(t)
	a, _ := testAdapter(t, m)
	s := testSession(t, m)
	prompt := tokenize(t, m, referencePrompt)
	base := promptLogits(t, s, prompt, nil, 0)
	zero := promptLogits(t, s, prompt, a, 0)
	for i := range base {
		if math.Float32bits(base[i]) != math.Float32bits(zero[i]) {
			t.Fatalf("scale 0: logit %d is %v, without adapter %v", i, zero[i], base[i])
		}
	}
	half := promptLogits(t, s, prompt, a, 0.5)
	moved := 0.0
	for i := range base {
		moved = math.Max(moved, math.Abs(float64(half[i]-base[i])))
	}
	if moved < 0.1 {
		t.Fatalf("scale 0.5 moved the logits by at most %g", moved)
	}

	gen, err := s.Generate(context.Background(), prompt,
		&GenerateOptions{MaxNewTokens: 8, IgnoreEOS: true, Adapter: a, AdapterScale: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	seq, err := s.SeqOpen()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SeqSetAdapter(seq, a, 0.5); err != nil {
		t.Fatal(err)
	}
	fork, err := s.SeqFork(seq)
	if err != nil {
		t.Fatal(err)
	}
	if a.InUse() != 2 {
		t.Fatalf("a sequence and its fork hold the adapter %d times", a.InUse())
	}
	if got := decodeGreedy(t, s, seq, prompt, 8); !sameTokens(got, gen.Tokens) {
		t.Fatalf("sequence %v, generate %v", got, gen.Tokens)
	}
	// Its K/V depend on the adapter: no change once it holds tokens.
	if err := s.SeqSetAdapter(seq, nil, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("SeqSetAdapter on a sequence with tokens: %v", err)
	}
	for _, q := range []SeqID{seq, fork} {
		if err := s.SeqClose(q); err != nil {
			t.Fatal(err)
		}
	}
	if a.InUse() != 0 {
		t.Fatalf("closed sequences still hold the adapter %d times", a.InUse())
	}
}

func TestAdapterLoadErrors(t *testing.T) {
	m := testModel(t)
	writeTestAdapter(t, m) // skips with a library older than 1.4
	missing := filepath.Join(t.TempDir(), "missing-lora.gguf")
	_, err := LoadAdapter(m, missing, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrIO || !strings.Contains(e.Message, "missing-lora.gguf") {
		t.Fatalf("missing file: %v", err)
	}
	// A model is a GGUF file but not an adapter.
	_, err = LoadAdapter(m, os.Getenv("LLMINFER_TEST_MODEL"), nil)
	if !errors.As(err, &e) || e.Status != ErrBadFormat || e.Message == "" {
		t.Fatalf("a model as adapter: %v", err)
	}
}

// A closed adapter is refused with ErrClosed wherever it is named.
func TestClosedAdapter(t *testing.T) {
	m := testModel(t)
	a, _ := testAdapter(t, m)
	s := testSession(t, m)
	prompt := tokenize(t, m, referencePrompt)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if a.ptr != nil {
		t.Fatal("an unused adapter was not freed by Close")
	}
	if _, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 2, Adapter: a}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Generate: %v", err)
	}
	if _, err := s.Submit(prompt, &RequestOptions{MaxNewTokens: 2, Adapter: a}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit: %v", err)
	}
	if _, err := s.Stream(context.Background(), prompt, &RequestOptions{MaxNewTokens: 2, Adapter: a}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stream: %v", err)
	}
	seq, err := s.SeqOpen()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SeqSetAdapter(seq, a, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("SeqSetAdapter: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// Close while requests or sequences use the adapter defers the free: the
// request runs on with the adapter and finishes with the tokens of an
// open one, and the last user frees it; the model waits for the adapter.
func TestAdapterCloseWhileInUse(t *testing.T) {
	m := testModel(t)
	open, path := testAdapter(t, m)
	s := testSession(t, m)
	prompt := tokenize(t, m, referencePrompt)
	want, err := s.Generate(context.Background(), prompt,
		&GenerateOptions{MaxNewTokens: 8, IgnoreEOS: true, Adapter: open})
	if err != nil {
		t.Fatal(err)
	}
	a, err := LoadAdapter(m, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Submit(prompt, &RequestOptions{MaxNewTokens: 8, IgnoreEOS: true, Adapter: a})
	if err != nil {
		t.Fatal(err)
	}
	seq, err := s.SeqOpen()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SeqSetAdapter(seq, a, 1); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if a.ptr == nil || a.InUse() != 2 {
		t.Fatalf("Close freed an adapter in use (ptr %v, %d uses)", a.ptr, a.InUse())
	}
	if _, err := s.Submit(prompt, &RequestOptions{Adapter: a}); !errors.Is(err, ErrClosed) {
		t.Fatalf("a new request on a closed adapter: %v", err)
	}
	if got := stepRequest(t, s, id); !sameTokens(got, want.Tokens) {
		t.Fatalf("after Close the request gave %v, want %v", got, want.Tokens)
	}
	if a.ptr == nil || a.InUse() != 1 {
		t.Fatalf("the sequence lost its adapter (ptr %v, %d uses)", a.ptr, a.InUse())
	}
	if got := decodeGreedy(t, s, seq, prompt, 8); !sameTokens(got, want.Tokens) {
		t.Fatalf("after Close the sequence gave %v, want %v", got, want.Tokens)
	}
	if err := s.SeqClose(seq); err != nil {
		t.Fatal(err)
	}
	if a.ptr != nil || a.InUse() != 0 {
		t.Fatalf("the last user did not free the closed adapter (%d uses)", a.InUse())
	}

	// Session.Close gives back what its requests and sequences held.
	b, err := LoadAdapter(m, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2 := testSession(t, m)
	if _, err := s2.Submit(prompt, &RequestOptions{MaxNewTokens: 4, Adapter: b}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	s2.Close()
	if b.ptr != nil {
		t.Fatal("closing the session did not free the closed adapter its request held")
	}
}

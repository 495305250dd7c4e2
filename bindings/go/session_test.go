package llminfer

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

const referencePrompt = "The capital of France is"

func TestGreedyMatchesLLMRun(t *testing.T) {
	m := testModel(t)
	run := os.Getenv("LLMINFER_RUN")
	if run == "" {
		t.Skip("LLMINFER_RUN is not set: skipping the comparison with llm-run")
	}
	const n = 24
	cmd := exec.Command(run, "-m", os.Getenv("LLMINFER_TEST_MODEL"), "-p", referencePrompt,
		"-n", "24", "--temp", "0", "-t", "2")
	cmd.Stderr = nil
	want, err := cmd.Output()
	if err != nil {
		t.Fatalf("llm-run: %v", err)
	}
	s := testSession(t, m)
	gen, err := s.Generate(context.Background(), tokenize(t, m, referencePrompt), &GenerateOptions{MaxNewTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	// llm-run prints the prompt, the pieces and a newline.
	if got := referencePrompt + gen.Text + "\n"; got != string(want) {
		t.Fatalf("binding: %q\nllm-run: %q", got, want)
	}
	if gen.GeneratedTokens != len(gen.Tokens) || gen.PromptTokens == 0 {
		t.Fatalf("inconsistent result %+v", gen)
	}
}

func collectStream(t *testing.T, stream *Stream) ([]Token, string) {
	t.Helper()
	var tokens []Token
	var text strings.Builder
	for stream.Next() {
		ev := stream.Token()
		if ev.Token != NoToken {
			tokens = append(tokens, ev.Token)
		}
		text.WriteString(ev.Text)
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return tokens, text.String()
}

func TestStreamEqualsGenerate(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Once upon a time")
	gen, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := s.Stream(context.Background(), prompt, &RequestOptions{MaxNewTokens: 20, Logprobs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	tokens, text := collectStream(t, stream)
	if !sameTokens(tokens, gen.Tokens) || text != gen.Text {
		t.Fatalf("stream %v %q\ngenerate %v %q", tokens, text, gen.Tokens, gen.Text)
	}
	if stream.FinishReason() != gen.Finish {
		t.Fatalf("finish %v, generate %v", stream.FinishReason(), gen.Finish)
	}

	events, err := s.StreamChannel(context.Background(), prompt, &RequestOptions{MaxNewTokens: 20})
	if err != nil {
		t.Fatal(err)
	}
	var chanTokens []Token
	var chanText strings.Builder
	var last Event
	for ev := range events {
		if ev.Token != NoToken {
			chanTokens = append(chanTokens, ev.Token)
		}
		chanText.WriteString(ev.Text)
		last = ev
	}
	if last.Err != nil || last.Finish != gen.Finish || last.Token != NoToken {
		t.Fatalf("last channel event %+v", last)
	}
	if !sameTokens(chanTokens, gen.Tokens) || chanText.String() != gen.Text {
		t.Fatalf("channel %v %q\ngenerate %v %q", chanTokens, chanText.String(), gen.Tokens, gen.Text)
	}
}

func TestSeededSamplingIsReproducible(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "My favourite animal is")
	sampling := DefaultSampling()
	sampling.Temperature = 1.0
	sampling.Seed = 1234
	opts := &GenerateOptions{MaxNewTokens: 16, Sampling: &sampling, IgnoreEOS: true}
	first, err := s.Generate(context.Background(), prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Generate(context.Background(), prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !sameTokens(first.Tokens, second.Tokens) {
		t.Fatalf("same seed, different tokens: %v vs %v", first.Tokens, second.Tokens)
	}
	// A request draws with the same (seed, position) keys as llm_generate.
	stream, err := s.Stream(context.Background(), prompt, &RequestOptions{MaxNewTokens: 16, Sampling: &sampling, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if tokens, _ := collectStream(t, stream); !sameTokens(tokens, first.Tokens) {
		t.Fatalf("stream with the same seed: %v vs %v", tokens, first.Tokens)
	}
}

func TestInvalidParamsGiveMessages(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	sampling := DefaultSampling()
	sampling.TopP = 0
	_, err := s.Submit(tokenize(t, m, "hi"), &RequestOptions{Sampling: &sampling})
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "top_p") {
		t.Fatalf("top_p 0 gave %v", err)
	}
	if last := s.LastError(); !errors.Is(last, ErrInvalidArgument) {
		t.Fatalf("LastError() = %v", last)
	}
	long := make([]Token, 600)
	for i := range long {
		long[i] = 42
	}
	if _, err := s.Generate(context.Background(), long, nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("a prompt over the context gave %v", err)
	}
	if _, err := s.Submit(long, nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("submitting a prompt over the context gave %v", err)
	}
	if err := s.Cancel(987654); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancelling an unknown request gave %v", err)
	}
}

func TestGenerateCancelledByContext(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	gen, err := s.Generate(ctx, tokenize(t, m, "Count forever:"), &GenerateOptions{MaxNewTokens: 480, IgnoreEOS: true})
	elapsed := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrCancelled) {
		t.Fatalf("Generate returned %v", err)
	}
	var ce *CancelledError
	if !errors.As(err, &ce) {
		t.Fatalf("want a *CancelledError, got %T", err)
	}
	if gen == nil || gen.Finish != FinishCancelled || len(gen.Tokens) >= 480 {
		t.Fatalf("partial result %+v", gen)
	}
	if elapsed > 3*time.Second {
		t.Fatalf("interrupt took %v", elapsed)
	}
	// The session goes on working.
	if _, err := s.Generate(context.Background(), tokenize(t, m, "Hello"), &GenerateOptions{MaxNewTokens: 2}); err != nil {
		t.Fatalf("Generate after an interrupt: %v", err)
	}
	// An already cancelled context does not start anything.
	if _, err := s.Generate(ctx, tokenize(t, m, "Hello"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Generate with a done context: %v", err)
	}
}

func TestSessionCloseTwiceAndUseAfterClose(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Hello")
	stream, err := s.Stream(context.Background(), prompt, &RequestOptions{MaxNewTokens: 50, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Next() {
		t.Fatalf("no first token: %v", stream.Err())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if stream.Next() || !errors.Is(stream.Err(), ErrClosed) {
		t.Fatalf("stream after session Close: err %v", stream.Err())
	}
	stream.Close()
	stream.Close()
	if _, err := s.Generate(context.Background(), prompt, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Generate after Close: %v", err)
	}
	if _, err := s.Submit(prompt, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if _, err := s.Step(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Step after Close: %v", err)
	}
	if _, err := s.Stream(context.Background(), prompt, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stream after Close: %v", err)
	}
	if err := s.Cancel(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Cancel after Close: %v", err)
	}
	if _, err := s.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stats after Close: %v", err)
	}
	s.Interrupt() // harmless
}

func TestModelOutlivesItsSessions(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Hello")
	m.Close()
	// The session still holds the model.
	if _, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 2}); err != nil {
		t.Fatalf("Generate after the model's Close: %v", err)
	}
	s.Close()
	if m.ptr != nil {
		t.Fatal("the model was not freed with its last session")
	}
}

func TestCloseInterruptsGenerate(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Tell me a story")
	done := make(chan error, 1)
	go func() {
		_, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 480, IgnoreEOS: true})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	s.Close()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, ErrCancelled) && !errors.Is(err, ErrClosed) {
			t.Fatalf("Generate ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt Generate")
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("Close took %v", time.Since(start))
	}
}

func TestSpeculativeDecodingKeepsGreedyTokens(t *testing.T) {
	m := testModel(t)
	// The model drafting for itself accepts every draft: a cheap check that
	// the draft model and speculation options reach the library.
	s, err := NewSession(m, &SessionOptions{Threads: 2, ContextLength: 256, KVCacheBytes: 32 << 20, DraftModel: m})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	prompt := tokenize(t, m, referencePrompt)
	plain, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 12})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []SpecMode{SpecNgram, SpecDraft} {
		spec, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 12, Spec: mode, SpecK: 3})
		if err != nil {
			t.Fatalf("spec mode %d: %v", mode, err)
		}
		if !sameTokens(spec.Tokens, plain.Tokens) {
			t.Fatalf("spec mode %d: %v, plain %v", mode, spec.Tokens, plain.Tokens)
		}
		if mode == SpecDraft && spec.SpecSteps == 0 {
			t.Fatalf("draft speculation did not run: %+v", spec)
		}
	}
}

package llminfer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitForFreedKV polls the stats: a cancel frees blocks at once, or when a
// step computing the request on another goroutine ends.
func waitForFreedKV(t *testing.T, s *Session) Stats {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.BlocksUsed == 0 || time.Now().After(deadline) {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStreamCancelFreesKV(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := s.Stream(ctx, tokenize(t, m, "Write a very long poem about the sea."),
		&RequestOptions{MaxNewTokens: 400, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	for i := 0; i < 3; i++ {
		if !stream.Next() {
			t.Fatalf("stream ended early: %v", stream.Err())
		}
	}
	if st, _ := s.Stats(); st.BlocksUsed == 0 {
		t.Fatal("a running request holds no KV blocks")
	}
	cancel()
	if stream.Next() {
		// At most the tokens already routed to it are dropped: none come now.
		t.Fatal("Next after cancel gave a token")
	}
	err = stream.Err()
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrCancelled) {
		t.Fatalf("Err() = %v", err)
	}
	if stream.FinishReason() != FinishCancelled {
		t.Fatalf("finish %v", stream.FinishReason())
	}
	if st := waitForFreedKV(t, s); st.BlocksUsed != 0 {
		t.Fatalf("blocks still used after cancel: %+v", st)
	}
	// The cancelled request's finish event is swallowed, not handed to Step.
	events, err := s.Step()
	if err != nil || len(events) != 0 {
		t.Fatalf("Step after a cancelled stream: %v %+v", err, events)
	}
}

func TestStreamCloseCancelsRequest(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	stream, err := s.Stream(context.Background(), tokenize(t, m, "Hello there"),
		&RequestOptions{MaxNewTokens: 400, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Next() {
		t.Fatal(stream.Err())
	}
	stream.Close()
	stream.Close()
	if stream.Next() || !errors.Is(stream.Err(), ErrClosed) {
		t.Fatalf("Next after Close: %v", stream.Err())
	}
	if st := waitForFreedKV(t, s); st.BlocksUsed != 0 {
		t.Fatalf("blocks still used after Close: %+v", st)
	}
}

func concurrencyPrompts(t *testing.T, m *Model, n int) [][]Token {
	prompts := make([][]Token, n)
	for i := range prompts {
		prompts[i] = tokenize(t, m, fmt.Sprintf("Once upon a time there were %d little", i+2))
	}
	return prompts
}

// solo answers are what each prompt gives alone; batching must not change them.
func soloAnswers(t *testing.T, s *Session, prompts [][]Token, n int) [][]Token {
	answers := make([][]Token, len(prompts))
	for i, p := range prompts {
		gen, err := s.Generate(context.Background(), p, &GenerateOptions{MaxNewTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		if len(gen.Tokens) == 0 {
			t.Fatalf("prompt %d gives no tokens: the comparison would prove nothing", i)
		}
		answers[i] = gen.Tokens
	}
	return answers
}

func TestConcurrentStreamsOnOneSession(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	const n = 10
	prompts := concurrencyPrompts(t, m, 4)
	want := soloAnswers(t, s, prompts, n)
	var wg sync.WaitGroup
	got := make([][]Token, len(prompts))
	errs := make([]error, len(prompts))
	for i := range prompts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream, err := s.Stream(context.Background(), prompts[i], &RequestOptions{MaxNewTokens: n})
			if err != nil {
				errs[i] = err
				return
			}
			defer stream.Close()
			for stream.Next() {
				got[i] = append(got[i], stream.Token().Token)
			}
			errs[i] = stream.Err()
		}(i)
	}
	wg.Wait()
	for i := range prompts {
		if errs[i] != nil {
			t.Fatalf("stream %d: %v", i, errs[i])
		}
		if !sameTokens(got[i], want[i]) {
			t.Errorf("stream %d: %v, alone %v", i, got[i], want[i])
		}
	}
}

func TestManySubmittersOneStepper(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	const n = 8
	prompts := concurrencyPrompts(t, m, 6)
	want := soloAnswers(t, s, prompts, n)

	ids := make(chan [2]uint64, len(prompts)) // (request id, prompt index)
	var submitters sync.WaitGroup
	for i := range prompts {
		submitters.Add(1)
		go func(i int) {
			defer submitters.Done()
			// Spread the submits over the first steps.
			time.Sleep(time.Duration(i) * 15 * time.Millisecond)
			id, err := s.Submit(prompts[i], &RequestOptions{MaxNewTokens: n})
			if err != nil {
				t.Errorf("Submit %d: %v", i, err)
				return
			}
			ids <- [2]uint64{uint64(id), uint64(i)}
		}(i)
	}
	go func() { submitters.Wait(); close(ids) }()

	// A stream running beside them keeps its own events.
	stream, err := s.Stream(context.Background(), prompts[0], &RequestOptions{MaxNewTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()

	tokens := map[RequestID][]Token{}
	finished := map[RequestID]FinishReason{}
	index := map[RequestID]int{}
	idsOpen := true
	deadline := time.Now().Add(60 * time.Second)
	for idsOpen || len(finished) < len(index) {
		if time.Now().After(deadline) {
			t.Fatalf("requests did not finish: %d of %d", len(finished), len(index))
		}
		for drained := false; idsOpen && !drained; {
			select {
			case pair, ok := <-ids:
				if !ok {
					idsOpen = false
				} else {
					index[RequestID(pair[0])] = int(pair[1])
				}
			default:
				drained = true
			}
		}
		events, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			if ev.Token != NoToken {
				tokens[ev.Request] = append(tokens[ev.Request], ev.Token)
			}
			if ev.Finish != FinishNone {
				finished[ev.Request] = ev.Finish
			}
		}
	}
	if len(index) != len(prompts) {
		t.Fatalf("%d of %d submits succeeded", len(index), len(prompts))
	}
	for id, i := range index {
		if !sameTokens(tokens[id], want[i]) {
			t.Errorf("request %d (prompt %d): %v, alone %v", id, i, tokens[id], want[i])
		}
		if _, ok := tokens[stream.ID()]; ok {
			t.Errorf("Step returned the stream's events")
		}
	}
	streamTokens, _ := collectStream(t, stream)
	if !sameTokens(streamTokens, want[0]) {
		t.Errorf("stream beside the submitted requests: %v, alone %v", streamTokens, want[0])
	}
}

func TestStopStringsAndTopLogprobs(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, referencePrompt)
	full, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 12})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(full.Text, "Paris") {
		t.Skipf("the model answers %q; the stop string test expects Paris", full.Text)
	}
	stream, err := s.Stream(context.Background(), prompt, &RequestOptions{
		MaxNewTokens: 12, StopStrings: []string{"Paris"}, Logprobs: true, TopLogprobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var text strings.Builder
	for stream.Next() {
		ev := stream.Token()
		text.WriteString(ev.Text)
		if ev.Token != NoToken && (len(ev.TopTokens) != 3 || len(ev.TopLogprobs) != 3 || ev.Logprob > 0) {
			t.Fatalf("log-probabilities missing: %+v", ev)
		}
	}
	if stream.Err() != nil || stream.FinishReason() != FinishStop || strings.Contains(text.String(), "Paris") {
		t.Fatalf("stop string: %q, finish %v, err %v", text.String(), stream.FinishReason(), stream.Err())
	}
}

func TestSessionCreateErrorMessage(t *testing.T) {
	m := testModel(t)
	_, err := NewSession(m, &SessionOptions{KVType: 9})
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "kv_type") {
		t.Fatalf("an unknown kv_type gave %v", err)
	}
}

// Each failing call gets its own message although goroutines share the
// session and move between OS threads.
func TestConcurrentFailuresKeepTheirMessages(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "hi")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				sampling, field := DefaultSampling(), "top_p"
				if (g+i)%2 == 0 {
					sampling.Temperature, field = -1, "temperature"
				} else {
					sampling.TopP = 0
				}
				_, err := s.Submit(prompt, &RequestOptions{Sampling: &sampling})
				var e *Error
				if !errors.As(err, &e) || !strings.Contains(e.Message, field) {
					t.Errorf("a bad %s gave %v", field, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestStreamWithSamples(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := concurrencyPrompts(t, m, 1)[0]
	want := soloAnswers(t, s, [][]Token{prompt}, 6)[0]
	stream, err := s.Stream(context.Background(), prompt, &RequestOptions{MaxNewTokens: 6, Samples: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	got := make([][]Token, 3)
	for stream.Next() {
		ev := stream.Token()
		got[ev.Sample] = append(got[ev.Sample], ev.Token)
	}
	if stream.Err() != nil {
		t.Fatal(stream.Err())
	}
	// Greedy samples are all the greedy continuation.
	for i := range got {
		if !sameTokens(got[i], want) {
			t.Errorf("sample %d: %v, want %v", i, got[i], want)
		}
	}
}

func TestCloseWhileStreamsRun(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompts := concurrencyPrompts(t, m, 3)
	var wg sync.WaitGroup
	errs := make(chan error, len(prompts))
	started := make(chan struct{}, len(prompts))
	for i := range prompts {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream, err := s.Stream(context.Background(), prompts[i], &RequestOptions{MaxNewTokens: 400, IgnoreEOS: true})
			if err != nil {
				errs <- err
				started <- struct{}{}
				return
			}
			defer stream.Close()
			first := true
			for stream.Next() {
				if first {
					started <- struct{}{}
					first = false
				}
			}
			if first {
				started <- struct{}{}
			}
			errs <- stream.Err()
		}(i)
	}
	for range prompts {
		<-started
	}
	s.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("a stream ended with %v, want ErrClosed", err)
		}
	}
}

func TestGenerateBesideStreams(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompts := concurrencyPrompts(t, m, 2)
	want := soloAnswers(t, s, prompts, 10)
	streamDone := make(chan []Token, 1)
	stream, err := s.Stream(context.Background(), prompts[1], &RequestOptions{MaxNewTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	go func() {
		var tokens []Token
		for stream.Next() {
			tokens = append(tokens, stream.Token().Token)
		}
		streamDone <- tokens
	}()
	// The stream's request advances in Generate's steps; its events wait
	// in the library until the stream steps again.
	gen, err := s.Generate(context.Background(), prompts[0], &GenerateOptions{MaxNewTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	if !sameTokens(gen.Tokens, want[0]) {
		t.Errorf("Generate beside a stream: %v, alone %v", gen.Tokens, want[0])
	}
	if got := <-streamDone; !sameTokens(got, want[1]) || stream.Err() != nil {
		t.Errorf("stream beside Generate: %v (%v), alone %v", got, stream.Err(), want[1])
	}
}

// The quantized KV caches (libllminfer 1.4): a Q8_0 cache follows the F16
// cache's greedy tokens at first (SmolLM2: 19 of 64, tests/unit/test_kvquant.c),
// and a Q4_0 cache generates too.
func TestQuantizedKVTypes(t *testing.T) {
	m := testModel(t)
	prompt := tokenize(t, m, "The history of the printing press begins in the fifteenth century, when")
	greedy := func(kv KVType) []Token {
		s, err := NewSession(m, &SessionOptions{KVType: kv, ContextLength: 256, Threads: 2})
		if err != nil {
			t.Fatalf("kv type %d: %v", kv, err)
		}
		defer s.Close()
		g, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 12})
		if err != nil {
			t.Fatalf("kv type %d: Generate: %v", kv, err)
		}
		return g.Tokens
	}
	f16, q8, q4 := greedy(KVF16), greedy(KVQ8_0), greedy(KVQ4_0)
	if len(f16) < 8 || len(q8) < 8 || len(q4) == 0 {
		t.Fatalf("too few tokens: f16 %d, q8_0 %d, q4_0 %d", len(f16), len(q8), len(q4))
	}
	for i := 0; i < 8; i++ {
		if f16[i] != q8[i] {
			t.Fatalf("token %d: q8_0 %d, f16 %d", i, q8[i], f16[i])
		}
	}
}

package llminfer

import (
	"context"
	"errors"
	"math"
	"testing"
)

func argmax(logits []float32) Token {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return Token(best)
}

// decodeGreedy feeds prompt to seq and then n greedy tokens, by hand.
func decodeGreedy(t *testing.T, s *Session, seq SeqID, prompt []Token, n int) []Token {
	t.Helper()
	b, err := NewBatch(len(prompt) + 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start, err := s.SeqLen(seq)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range prompt {
		if _, err := b.Add(seq, start+i, tok, i == len(prompt)-1); err != nil {
			t.Fatal(err)
		}
	}
	var out []Token
	for {
		if err := s.Decode(b); err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if len(out) == n {
			return out
		}
		logits, err := s.Logits(b.Len() - 1)
		if err != nil {
			t.Fatalf("Logits: %v", err)
		}
		tok := argmax(logits)
		out = append(out, tok)
		b.Clear()
		pos, _ := s.SeqLen(seq)
		if _, err := b.Add(seq, pos, tok, true); err != nil {
			t.Fatal(err)
		}
	}
}

// Host-driven greedy decoding gives the tokens of the library's own
// generation (the request path), and a fork of the prompt repeats them.
func TestTokenLevelMatchesGenerate(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "The capital of Germany is")
	g, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 8})
	if err != nil || len(g.Tokens) == 0 {
		t.Fatalf("Generate: %v %v", g, err)
	}
	seq, err := s.SeqOpen()
	if err != nil {
		t.Fatal(err)
	}
	byHand := decodeGreedy(t, s, seq, prompt, len(g.Tokens))
	if !sameTokens(byHand, g.Tokens) {
		t.Fatalf("by hand %v, Generate %v", byHand, g.Tokens)
	}
	held, err := s.SeqTokens(seq)
	if err != nil || len(held) != len(prompt)+len(byHand) || !sameTokens(held[:len(prompt)], prompt) {
		t.Fatalf("SeqTokens: %v %v", held, err)
	}
	if err := s.SeqTruncate(seq, len(prompt)); err != nil {
		t.Fatal(err)
	}
	fork, err := s.SeqFork(seq)
	if err != nil {
		t.Fatal(err)
	}
	if again := decodeGreedy(t, s, fork, byHand[:1], 3); !sameTokens(again, byHand[1:4]) {
		t.Errorf("fork: %v, want %v", again, byHand[1:4])
	}
	if err := s.SeqClose(fork); err != nil {
		t.Fatal(err)
	}
	if err := s.SeqClose(seq); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SeqLen(seq); !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SeqLen of a closed sequence: %v", err)
	}
}

// A saved sequence continues in another session with bitwise the same
// logits; a session state keeps the ids; corrupt data is ErrBadFormat.
func TestStatesContinueExactly(t *testing.T) {
	m := testModel(t)
	a := testSession(t, m)
	seq, _ := a.SeqOpen()
	decodeGreedy(t, a, seq, tokenize(t, m, "Once upon a time"), 2)
	state, err := a.SeqStateSave(seq)
	if err != nil || len(state) == 0 {
		t.Fatalf("SeqStateSave: %v", err)
	}
	whole, err := a.StateSave()
	if err != nil {
		t.Fatal(err)
	}
	b := testSession(t, m)
	loaded, err := b.SeqStateLoad(state)
	if err != nil {
		t.Fatal(err)
	}
	ta, _ := a.SeqTokens(seq)
	tb, _ := b.SeqTokens(loaded)
	if !sameTokens(ta, tb) {
		t.Fatalf("tokens %v after load, %v before", tb, ta)
	}
	next := func(s *Session, id SeqID) []float32 {
		batch, _ := NewBatch(1)
		defer batch.Close()
		n, _ := s.SeqLen(id)
		if _, err := batch.Add(id, n, ta[len(ta)-1], true); err != nil {
			t.Fatal(err)
		}
		if err := s.Decode(batch); err != nil {
			t.Fatal(err)
		}
		l, err := s.Logits(0)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	la, lb := next(a, seq), next(b, loaded)
	for i := range la {
		if math.Float32bits(la[i]) != math.Float32bits(lb[i]) {
			t.Fatalf("logit %d: %v after load, %v in the original", i, lb[i], la[i])
		}
	}
	c := testSession(t, m)
	if err := c.StateLoad(whole); err != nil {
		t.Fatal(err)
	}
	if n, err := c.SeqLen(seq); err != nil || n != len(ta) {
		t.Errorf("session state: sequence %d has %d tokens (%v), want %d", seq, n, err, len(ta))
	}
	bad := append([]byte(nil), state...)
	bad[len(bad)/2] ^= 0xff
	if _, err := c.SeqStateLoad(bad); !errors.Is(err, ErrBadFormat) {
		t.Errorf("corrupt state: %v, want ErrBadFormat", err)
	}
}

func TestSampler(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Hello, how are you?")
	seq, _ := s.SeqOpen()
	b, _ := NewBatch(len(prompt))
	defer b.Close()
	for i, tok := range prompt {
		b.Add(seq, i, tok, i == len(prompt)-1)
	}
	if err := s.Decode(b); err != nil {
		t.Fatal(err)
	}
	logits, err := s.Logits(len(prompt) - 1)
	if err != nil {
		t.Fatal(err)
	}
	greedy, err := NewSampler(m, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer greedy.Close()
	if tok, err := greedy.Sample(logits, prompt, 0, 1); err != nil || tok != argmax(logits) {
		t.Errorf("greedy sampler: %v %v, argmax %v", tok, err, argmax(logits))
	}
	hot := DefaultSampling()
	hot.Temperature, hot.TopK, hot.TopP, hot.MinP, hot.Seed = 1.5, 0, 1, 0, 42
	draw := func() []Token {
		sp, err := NewSampler(m, &hot, 7)
		if err != nil {
			t.Fatal(err)
		}
		defer sp.Close()
		var out []Token
		for pos := uint64(0); pos < 16; pos++ {
			tok, err := sp.Sample(logits, prompt, 0, pos)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tok)
		}
		return out
	}
	first, second := draw(), draw()
	if !sameTokens(first, second) {
		t.Errorf("same seed, stream and positions: %v then %v", first, second)
	}
	distinct := map[Token]bool{}
	for _, tok := range first {
		distinct[tok] = true
	}
	if len(distinct) < 2 {
		t.Errorf("a hot sampler drew one token 16 times: %v", first)
	}
	if _, err := greedy.Sample(logits[:10], prompt, 0, 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("short logits: %v", err)
	}
	if _, err := s.Logits(0); err == nil {
		t.Error("logits of a row that did not ask for them: no error")
	}
}

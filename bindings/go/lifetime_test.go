package llminfer

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// collectUntil runs the garbage collector until cond holds or time is up.
func collectUntil(cond func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		runtime.GC()
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func TestFinalizerCancelsAbandonedStream(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Write a long letter to a friend.")
	func() {
		stream, err := s.Stream(context.Background(), prompt, &RequestOptions{MaxNewTokens: 400, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		if !stream.Next() {
			t.Fatal(stream.Err())
		}
	}()
	freed := collectUntil(func() bool {
		st, err := s.Stats()
		return err == nil && st.BlocksUsed == 0
	})
	if !freed {
		t.Fatal("an abandoned stream's request kept its KV blocks")
	}
}

func TestFinalizerFreesAbandonedSession(t *testing.T) {
	m := testModel(t)
	func() {
		s, err := NewSession(m, &SessionOptions{Threads: 1, ContextLength: 128, KVCacheBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Generate(context.Background(), tokenize(t, m, "Hi"), &GenerateOptions{MaxNewTokens: 1}); err != nil {
			t.Fatal(err)
		}
	}()
	if !collectUntil(func() bool { return m.sessions.Load() == 0 }) {
		t.Fatal("an abandoned session was not freed")
	}
}

func TestStreamWatcherGoroutinesEnd(t *testing.T) {
	m := testModel(t)
	s := testSession(t, m)
	prompt := tokenize(t, m, "Hello")
	before := runtime.NumGoroutine()
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := s.Stream(ctx, prompt, &RequestOptions{MaxNewTokens: 2})
		if err != nil {
			t.Fatal(err)
		}
		collectStream(t, stream)
		stream.Close()
		cancel()
	}
	ok := collectUntil(func() bool { return runtime.NumGoroutine() <= before })
	if !ok {
		t.Fatalf("goroutines: %d before, %d after", before, runtime.NumGoroutine())
	}
}

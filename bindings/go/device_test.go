package llminfer

import (
	"context"
	"os/exec"
	"strings"
	"testing"
)

func gpuPresent() bool {
	out, err := exec.Command("nvidia-smi", "-L").Output()
	return err == nil && strings.HasPrefix(string(out), "GPU ")
}

// Sessions on named backends and ranks, as llm_device_params has them: the
// library's reasons come back as errors, and 3 CPU ranks give the single
// rank's greedy tokens (SmolLM2's 9 heads split in 1, 3 or 9).
func TestDeviceSelection(t *testing.T) {
	m := testModel(t)
	open := func(o SessionOptions) (*Session, error) {
		o.Threads, o.ContextLength, o.KVCacheBytes = 2, 512, 32<<20
		return NewSession(m, &o)
	}
	for _, c := range []struct {
		opts SessionOptions
		want string
	}{
		{SessionOptions{Device: "bogus"}, "no backend named 'bogus'"},
		{SessionOptions{Device: "cpu", TensorParallel: 2}, "do not split"},
		{SessionOptions{Device: "cpu", TensorParallel: 3, Devices: []int{0}}, "devices"},
		{SessionOptions{Device: "cpu", Devices: []int{1}}, "device"},
	} {
		s, err := open(c.opts)
		if err == nil {
			s.Close()
			t.Fatalf("%+v: no error, want one saying %q", c.opts, c.want)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want it to say %q", c.opts, err, c.want)
		}
	}
	if !gpuPresent() {
		_, err := open(SessionOptions{Device: "cuda"})
		if err == nil || !strings.Contains(err.Error(), "backend 'cuda' is not available") {
			t.Errorf("Device cuda without a GPU: %v", err)
		}
	}

	prompt := tokenize(t, m, "The capital of Germany is")
	greedy := func(o SessionOptions) []Token {
		s, err := open(o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		defer s.Close()
		g, err := s.Generate(context.Background(), prompt, &GenerateOptions{MaxNewTokens: 8})
		if err != nil {
			t.Fatalf("%+v: Generate: %v", o, err)
		}
		return g.Tokens
	}
	one := greedy(SessionOptions{})
	if len(one) == 0 {
		t.Fatal("no tokens: the comparison would prove nothing")
	}
	for _, o := range []SessionOptions{
		{Device: "cpu"},
		{Device: "auto"}, // the CPU when no GPU is available
		{Device: "cpu", TensorParallel: 3},
		{Device: "cpu", TensorParallel: 3, Devices: []int{0, 0, 0}},
	} {
		if o.Device == "auto" && gpuPresent() {
			continue
		}
		if got := greedy(o); !sameTokens(got, one) {
			t.Errorf("%+v: tokens %v, one CPU rank gives %v", o, got, one)
		}
	}
}

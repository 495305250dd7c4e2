// Command chat streams a model's answer to one chat message:
//
//	go run ./examples/chat -model model.gguf "Why is the sky blue?"
//
// The prompt is rendered with the model's own chat template; Ctrl-C stops
// the answer (the request is cancelled and its memory freed).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	llminfer "github.com/libllminfer/llminfer-go"
)

func main() {
	modelPath := flag.String("model", os.Getenv("LLMINFER_TEST_MODEL"), "GGUF model with a chat template")
	system := flag.String("system", "You are a helpful assistant.", "system message")
	maxTokens := flag.Int("n", 128, "most tokens of the answer")
	temperature := flag.Float64("temp", 0, "sampling temperature, 0 = greedy")
	seed := flag.Uint64("seed", 0, "random seed when sampling")
	threads := flag.Int("t", 0, "threads, 0 = one per CPU")
	flag.Parse()
	question := strings.Join(flag.Args(), " ")
	if question == "" {
		question = "What is the capital of Germany?"
	}
	if *modelPath == "" {
		fmt.Fprintln(os.Stderr, "chat: give a model with -model (or set LLMINFER_TEST_MODEL)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := chat(ctx, *modelPath, *system, question, *maxTokens, *temperature, *seed, *threads); err != nil {
		fmt.Fprintln(os.Stderr, "chat:", err)
		os.Exit(1)
	}
}

func chat(ctx context.Context, modelPath, system, question string, maxTokens int,
	temperature float64, seed uint64, threads int) error {
	model, err := llminfer.LoadModel(modelPath, nil)
	if err != nil {
		return err
	}
	defer model.Close()
	session, err := llminfer.NewSession(model, &llminfer.SessionOptions{Threads: threads, ContextLength: 2048})
	if err != nil {
		return err
	}
	defer session.Close()

	prompt, err := model.ApplyChatTemplate([]llminfer.ChatMessage{
		{Role: "system", Content: system},
		{Role: "user", Content: question},
	}, true)
	if err != nil {
		return err
	}
	tokens, err := model.Tokenize(prompt, llminfer.AddSpecial|llminfer.ParseSpecial)
	if err != nil {
		return err
	}
	opts := &llminfer.RequestOptions{MaxNewTokens: maxTokens}
	if temperature > 0 {
		sampling := llminfer.DefaultSampling()
		sampling.Temperature = float32(temperature)
		sampling.Seed = seed
		opts.Sampling = &sampling
	}
	stream, err := session.Stream(ctx, tokens, opts)
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Next() {
		fmt.Print(stream.Token().Text)
	}
	fmt.Println()
	if err := stream.Err(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "[finished: %v]\n", stream.FinishReason())
	return nil
}

package role

import (
	"context"
	"errors"
	"testing"
)

func TestTogether(t *testing.T) {
	boom := errors.New("boom")
	untilDone := func(ctx context.Context) error { <-ctx.Done(); return nil }
	fails := func(context.Context) error { return boom }
	for _, c := range []struct {
		name   string
		runs   []func(context.Context) error
		cancel bool // the caller's context ends
		want   error
	}{
		{"one failing stops the others", []func(context.Context) error{untilDone, fails, untilDone}, false, boom},
		{"the caller's end stops all", []func(context.Context) error{untilDone, untilDone}, true, nil},
		{"none", nil, false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			if c.cancel {
				cancel()
			}
			defer cancel()
			if err := Together(ctx, c.runs...); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("Together = %v, want %v", err, c.want)
			}
		})
	}
}

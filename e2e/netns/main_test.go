package netns

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		RemoveStale()
	}
	os.Exit(m.Run())
}

package netns

import (
	"testing"

	"github.com/netplane/netplane/e2e/framework"
)

func TestMain(m *testing.M) { framework.Main(m) }

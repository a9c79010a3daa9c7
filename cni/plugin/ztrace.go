package plugin

import (
	"fmt"
	"os"
	"strings"
	"time"
)

var traceOn = os.Getenv("NPTRACE") != ""
var traceBuf strings.Builder

func Trace(step string) {
	if traceOn {
		fmt.Fprintf(&traceBuf, "%s=%d ", step, time.Now().UnixNano())
	}
}

func TraceFlush() {
	if traceOn {
		fmt.Fprintln(os.Stderr, "TRACE", os.Getenv("CNI_COMMAND"), os.Getenv("CNI_CONTAINERID"), traceBuf.String())
	}
}

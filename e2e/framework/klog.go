package framework

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

var klogTime = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})`)

// LogLine is the first (or, with last, the last) klog line of the log at
// path that contains every one of must, and its time; zero when none does.
// klog's lines carry no year: this year's is assumed.
func LogLine(path string, last bool, must ...string) (time.Time, string) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, ""
	}
	defer f.Close()
	var at time.Time
	var found string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if slices.ContainsFunc(must, func(s string) bool { return !strings.Contains(line, s) }) {
			continue
		}
		m := klogTime.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		t, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
		if err != nil {
			continue
		}
		at, found = t.AddDate(time.Now().Year(), 0, 0), line
		if !last {
			break
		}
	}
	return at, found
}

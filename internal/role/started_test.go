package role

import "testing"

func TestStartedRunsDoneOnceWhenTheLastPartEndsItsStart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parts int
		ends  []int // the parts whose start ends, in order; repeats allowed
		want  int   // times done ran
	}{
		{"every part, in order", 3, []int{0, 1, 2}, 1},
		{"every part, out of order and twice", 3, []int{2, 2, 0, 0, 1, 1}, 1},
		{"one part left", 3, []int{0, 2, 0, 2}, 0},
		{"one part", 1, []int{0}, 1},
		{"none ended", 2, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := 0
			s := NewStarted(func() { ran++ })
			var end []func()
			for range tc.parts {
				end = append(end, s.Begin())
			}
			for _, i := range tc.ends {
				end[i]()
			}
			if ran != tc.want {
				t.Errorf("done ran %d times, want %d", ran, tc.want)
			}
		})
	}
	var none *Started
	none.Begin()() // a nil Started counts nothing and does not panic
}

package v1alpha1

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ErrorOf is errs as one error, a line per field: "path: detail, got
// value". field.Error's own text puts the error's type between the path and
// the detail ("dns.ttl: Invalid value: 4000: must be ..."), the form of an
// API server's answer; a command-line user reads the form the flags'
// documentation uses. nil when errs is empty.
func ErrorOf(errs field.ErrorList) error {
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		out = append(out, errors.New(describe(e)))
	}
	return errors.Join(out...)
}

func describe(e *field.Error) string {
	msg := e.Field + ": " + e.Detail
	if e.Field == "" {
		msg = e.Detail
	}
	if e.Type != field.ErrorTypeInvalid && e.Type != field.ErrorTypeTypeInvalid {
		return msg
	}
	switch v := e.BadValue.(type) {
	case field.OmitValueType:
		return msg
	case string:
		return fmt.Sprintf("%s, got %q", msg, v)
	default:
		return fmt.Sprintf("%s, got %v", msg, v)
	}
}

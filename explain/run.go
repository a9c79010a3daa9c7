package explain

import (
	"context"

	"k8s.io/client-go/kubernetes"
)

// Run answers q: the objects from the API server, then on a node (when
// newKernel's kernel holds a node role's table and one of a node's
// addresses) what that node's kernel holds. newKernel may be nil.
func Run(ctx context.Context, c kubernetes.Interface, q Question, newKernel func() (Kernel, func(), error)) (*Explanation, error) {
	in, err := Read(ctx, c, q)
	if err != nil {
		return nil, err
	}
	var k Kernel
	if newKernel != nil {
		var done func()
		if k, done, err = newKernel(); err == nil {
			defer done()
			if err := Locate(k, in); err != nil {
				return nil, err
			}
		}
	}
	x, err := Explain(in)
	if err != nil {
		return nil, err
	}
	if in.Here != "" {
		if x.Kernel, err = Check(k, in, x); err != nil {
			return nil, err
		}
	}
	return x, nil
}

package node

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

var everything = labels.Everything()

// typesUID is the UID kubelet uses in references to its Node: the name.
func typesUID(name string) types.UID { return types.UID(name) }

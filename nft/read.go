package nft

// ReadTable reads table id of the namespace of d back once, for readers
// that compare the kernel with a model and never write (netplane explain):
// its chains, with as many rules as the kernel has (fingerprints only),
// and its named sets with their elements' ids, by the desired set's name.
// nil, nil when there is no such table.
func ReadTable(d Dialer, id TableID) (*Table, error) {
	k := &netlinkKernel{dialer: d, id: id}
	c, w, err := k.dial()
	if err != nil {
		return nil, err
	}
	w.Close()
	defer func() { _ = c.CloseLasting() }()
	k.conn = c
	kt, err := k.readBack(id)
	if err != nil || kt == nil {
		return nil, err
	}
	t := NewTable(id.Family, id.Name)
	for name, kc := range kt.chains {
		ch := t.Chain(name, kc.base)
		ch.Rules = make([]Rule, len(kc.rules))
		for i, fp := range kc.rules {
			ch.Rules[i].FP = fp
		}
	}
	for name, ks := range kt.sets {
		t.Sets[name] = &Set{Name: name, Spec: ks.spec, Elements: ks.elems.m, packed: ks.elems.p}
	}
	return t, nil
}
